"""The controller's side of refs: fetching them, and freeing them when they are dropped.

Every ref that reaches the controller is adopted here. Adoptions, drops (finalizers) and
explicit frees go through one queue to one thread, which counts the live copies of each
ref and sends the frees, batched per owner. Finalizers only put to the queue: they may run
in any thread, even in the middle of other code, so they take no lock.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from corral.errors import RefError, RefLostError, WorkerFailedError, WorkerNotFoundError
from corral.rpc.ref import PLANES, Ref

log = logging.getLogger("corral")
BATCH_SECONDS = 0.05
FREE_TIMEOUT = 5.0

#: ``call(worker, path, payload, timeout)`` and its async twin: the scheduler's requests
Call = Callable[[Any, str, Any, float | None], Any]
ACall = Callable[[Any, str, Any, float | None], Awaitable[Any]]


class DataPlane:
    def __init__(self, trial: str, lookup: Callable[[str], Any], call: Call, acall: ACall):
        """``lookup(worker_id)``: the live Worker or None."""
        self.trial = trial
        self.lookup = lookup
        self.call = call
        self.acall = acall
        self.gone: dict[tuple[str, str], str] = {}  # (worker id, generation) -> why lost
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._counts: dict[tuple[str, str, str], int] = {}
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        PLANES[trial] = self

    # lifetimes ------------------------------------------------------------------
    def adopt(self, ref: Ref) -> None:
        self._ensure_thread()
        self._events.put(("adopt", ref.ident))
        finalizer = weakref.finalize(ref, self._events.put, ("drop", ref.ident))
        finalizer.atexit = False

    def free(self, ref: Ref) -> None:
        self._ensure_thread()
        self._events.put(("free", ref.ident))

    def owner_gone(self, worker: Any, why: str) -> None:
        """Refs of ``worker`` (this process of it) are lost, e.g. its role was deleted."""
        self.gone[(worker.id, worker.generation)] = why

    def flush(self, timeout: float = 5.0) -> None:
        """Wait until every drop and free queued so far was sent (tests, benchmarks)."""
        if self._thread is None:
            return
        done = threading.Event()
        self._events.put(("flush", done))
        done.wait(timeout)

    def close(self) -> None:
        if self._thread is not None:
            self._events.put(("stop", None))
            self._thread.join(timeout=FREE_TIMEOUT + 1)
        if PLANES.get(self.trial) is self:
            del PLANES[self.trial]

    def _ensure_thread(self) -> None:
        if self._thread is not None:
            return
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="corral-ref-free", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        stop = False
        while not stop:
            events = [self._events.get()]
            try:  # gather what arrives within the batch window
                while True:
                    events.append(self._events.get(timeout=BATCH_SECONDS))
                    if len(events) > 4096:
                        break
            except queue.Empty:
                pass
            to_free: dict[tuple[str, str], list[str]] = {}
            flushes = []
            for kind, ident in events:
                if kind == "adopt":
                    self._counts[ident] = self._counts.get(ident, 0) + 1
                elif kind in ("drop", "free"):
                    left = self._counts.get(ident, 0) - 1 if kind == "drop" else 0
                    if left > 0:
                        self._counts[ident] = left
                    elif self._counts.pop(ident, None) is not None:
                        to_free.setdefault(ident[:2], []).append(ident[2])
                elif kind == "flush":
                    flushes.append(ident)
                elif kind == "stop":
                    stop = True
            for (owner, generation), keys in to_free.items():
                self._send_free(owner, generation, keys)
            for done in flushes:
                done.set()

    def _send_free(self, owner: str, generation: str, keys: list[str]) -> None:
        worker = self.lookup(owner)
        if worker is None or worker.generation != generation or (owner, generation) in self.gone:
            return  # the owner and its refs are gone already
        try:
            self.call(worker, "/data/free", {"keys": keys}, FREE_TIMEOUT)
        except Exception as exc:
            log.debug("freeing %d ref(s) on %s: %s", len(keys), owner, exc)

    # fetching ---------------------------------------------------------------------
    def _owner(self, ref: Ref) -> Any:
        if not isinstance(ref, Ref):
            raise RefError(f"expected a corral.Ref, got {type(ref).__name__}")
        ref.check_usable()
        if ref.trial != self.trial:
            raise RefError(
                f"{ref!r} belongs to trial {ref.trial!r}, not to this scheduler's trial "
                f"{self.trial!r}"
            )
        why = self.gone.get((ref.owner, ref.generation))
        if why is not None:
            raise RefLostError(f"{ref!r} is lost: its owner {ref.owner} {why}", ref.owner)
        worker = self.lookup(ref.owner)
        if worker is None:
            raise RefError(f"{ref!r} names owner {ref.owner!r}, which is no worker of this trial")
        if worker.generation != ref.generation:
            raise RefLostError(
                f"{ref!r} is lost: its owner {ref.owner} was restarted, and the refs of its "
                "earlier process went with it",
                ref.owner,
            )
        return worker

    def _groups(self, refs: list[Ref]) -> list[tuple[Any, list[Ref]]]:
        groups: dict[str, tuple[Any, list[Ref]]] = {}
        for ref in refs:
            worker = self._owner(ref)
            groups.setdefault(ref.owner, (worker, []))[1].append(ref)
        return list(groups.values())

    @staticmethod
    def _payload(refs: list[Ref]) -> dict:
        return {
            "keys": [r.key for r in refs],
            "trial": refs[0].trial,
            "generation": refs[0].generation,
        }

    @staticmethod
    def _lost(ref: Ref, exc: Exception) -> RefLostError:
        return RefLostError(f"{ref!r} is lost: its owner {ref.owner} died: {exc}", ref.owner)

    def fetch(self, refs: list[Ref], timeout: float | None = None) -> list[Any]:
        values: dict[int, Any] = {}
        for worker, group in self._groups(refs):
            try:
                got = self.call(worker, "/data/get", self._payload(group), timeout)
            except (WorkerFailedError, WorkerNotFoundError) as exc:
                raise self._lost(group[0], exc) from None
            values.update(zip(map(id, group), got, strict=True))
        return [values[id(r)] for r in refs]

    async def afetch(self, refs: list[Ref], timeout: float | None = None) -> list[Any]:
        groups = self._groups(refs)

        async def one(worker: Any, group: list[Ref]) -> list[Any]:
            try:
                return await self.acall(worker, "/data/get", self._payload(group), timeout)
            except (WorkerFailedError, WorkerNotFoundError) as exc:
                raise self._lost(group[0], exc) from None

        results = await asyncio.gather(*(one(w, g) for w, g in groups))
        values: dict[int, Any] = {}
        for (_worker, group), got in zip(groups, results, strict=True):
            values.update(zip(map(id, group), got, strict=True))
        return [values[id(r)] for r in refs]
