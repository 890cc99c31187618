"""A worker receiving refs in a call's arguments fetches their values from the owners.

The owner's address comes from name-resolve (never from the ref, so a forged ref cannot
point this worker at another host), the request goes through the same authenticated
client as every other request, and on the same host the bytes come through shared memory.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from typing import Any

from corral import name_resolve_keys
from corral.data import relay
from corral.data.relay import Relays
from corral.data.store import ObjectStore
from corral.errors import RefError, RefLostError
from corral.rpc import wire
from corral.rpc.ref import Ref
from corral.rpc.wire import DataclassRecord

FETCH_TIMEOUT = 600.0
NOTE_BATCH_SECONDS = 0.02


class RefResolver:
    def __init__(
        self,
        store: ObjectStore,
        experiment: str,
        trial: str,
        name_resolve,
        secret: str,
        relays: Relays | None = None,
    ):
        self.store = store
        self.relays = relays or Relays()
        self.experiment = experiment
        self.trial = trial
        self.name_resolve = name_resolve
        self.secret = secret
        self._client = None

    @property
    def client(self):
        if self._client is None:
            from corral.rpc.client import RPCClient

            self._client = RPCClient(self.secret)
            self._start_notifier()
        return self._client

    def _start_notifier(self) -> None:
        """Tell owners promptly when this worker's mappings of their segments are gone
        (otherwise the note waits for the next request to that owner)."""
        from corral.rpc import shm

        shm.NOTIFY = queue.SimpleQueue()
        threading.Thread(
            target=self._notify_loop, args=(shm.NOTIFY,), name="corral-shm-notes", daemon=True
        ).start()

    def _notify_loop(self, notes: queue.SimpleQueue) -> None:
        from corral.rpc import shm

        while True:
            pids = {notes.get()}
            time.sleep(NOTE_BATCH_SECONDS)
            while not notes.empty():
                pids.add(notes.get())
            for address, pid in list(self.client.shm.local.items()):
                if pid in pids and shm.has_released(pid):
                    try:  # any request carries the note; /health is the cheapest
                        self.client.request(address, "/health", method="GET", timeout=5.0)
                    except Exception:
                        self.client.forget(address)

    def resolve(self, payload: Any, refs: list[Ref]) -> Any:
        """``payload`` with each ref replaced by its value."""
        by_owner: dict[tuple[str, str], list[Ref]] = {}
        for ref in refs:
            if ref.trial != self.store.trial or ref.owner == self.store.owner:
                self.store.check(ref.trial, ref.generation)  # another trial, or our old self
            by_owner.setdefault((ref.owner, ref.generation), []).append(ref)
        values: dict[int, Any] = {}
        for (owner, generation), group in by_owner.items():
            wanted = list(dict.fromkeys(r.key for r in group))
            if owner == self.store.owner:
                got = self.store.get(wanted, self.store.trial, generation)
            else:
                got = self._fetch(owner, generation, wanted)
            by_key = dict(zip(wanted, got, strict=True))
            for ref in group:
                values[id(ref)] = by_key[ref.key]
        return substitute(payload, values)

    def _fetch(self, owner: str, generation: str, wanted: list[str]) -> list[Any]:
        address = self._address(owner, generation)
        payload = {"keys": wanted, "trial": self.store.trial, "generation": generation}
        if relay.ENABLED:  # the owner answers a relay plan if we are remote and it is large
            payload["relay"] = f"{self.store.owner}#{self.store.generation}"
        got = self._owner_request(owner, generation, address, "/data/get", payload)
        if isinstance(got, dict) and isinstance(got.get("relay"), dict):
            got = self._relayed(owner, generation, address, got["relay"])
        if not isinstance(got, list) or len(got) != len(wanted):
            raise RefError(f"worker {owner} answered a ref fetch with the wrong shape")
        return got

    def _owner_request(
        self, owner: str, generation: str, address: str, path: str, payload: dict
    ) -> Any:
        from corral.rpc.client import WorkerUnreachableError

        try:
            return self.client.request(
                address, path, payload, timeout=FETCH_TIMEOUT, identity=f"{owner}#{generation}"
            )
        except WorkerUnreachableError as exc:
            self.client.forget(address)
            raise RefLostError(
                f"the ref's owner {owner} at {address} is unreachable ({exc.cause}): it died, "
                "was restarted or deleted, and its refs are lost",
                owner,
            ) from None

    def _relayed(self, owner: str, generation: str, address: str, plan: dict) -> list[Any]:
        """Pull the frame of ``plan`` through the relay chain (data/relay.py) and decode
        it from a private (copy-on-write) mapping: the buffer is served on unchanged."""
        blob = str(plan.get("blob"))

        def fetch(upstream: str | None, offset: int, size: int) -> Any:
            chunk = {"blob": blob, "offset": offset, "size": size}
            if upstream is None:
                return self._owner_request(owner, generation, address, "/data/chunk", chunk)
            peer, _, peer_generation = upstream.partition("#")
            return self.client.request(
                self._address(peer, peer_generation),
                "/data/chunk",
                chunk,
                timeout=relay.UPSTREAM_TIMEOUT,
                identity=upstream,
            )

        return wire.decode(self.relays.pull(plan, fetch))

    def _address(self, owner: str, generation: str) -> str:
        role, _, index = owner.rpartition("/")
        if not role or not index.isdigit():
            raise RefError(f"ref owner {owner!r} is not a worker id of the form role/index")
        address = self.name_resolve.get(
            name_resolve_keys.worker_address_key(self.experiment, self.trial, role, int(index))
        )
        if address is None:
            raise RefLostError(
                f"the ref's owner {owner} is no longer registered: it was deleted or died, "
                "and its refs are lost",
                owner,
            )
        return address


def substitute(obj: Any, values: dict[int, Any]) -> Any:
    """``obj`` (a decoded frame) with the objects whose id is in ``values`` replaced."""
    if id(obj) in values:
        return values[id(obj)]
    if isinstance(obj, list):
        return [substitute(x, values) for x in obj]
    if isinstance(obj, tuple):
        return tuple(substitute(x, values) for x in obj)
    if isinstance(obj, DataclassRecord):
        return DataclassRecord(obj.class_path, {k: substitute(v, values) for k, v in obj.items()})
    if isinstance(obj, dict):
        return {k: substitute(v, values) for k, v in obj.items()}
    if isinstance(obj, set | frozenset):
        return {substitute(x, values) for x in obj}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changes = {
            f.name: substitute(getattr(obj, f.name), values) for f in dataclasses.fields(obj)
        }
        return dataclasses.replace(obj, **changes)
    return obj
