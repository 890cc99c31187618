"""The worker's side of refs: the values it keeps, and the refs it hands out for them.

Values are kept as they are (no copy). A fetch of the same keys by several readers on this
host at once is served from one shared-memory copy made for the first of them, so a
broadcast to N local workers costs one copy, not N.
"""

from __future__ import annotations

import dataclasses
import secrets
import sys
import threading
from typing import Any

from corral.errors import ConfigError, RefError, RefLostError
from corral.rpc.ref import Ref

#: the store of the worker running in this process (set by the worker runtime)
_CURRENT: ObjectStore | None = None


def keep(value: Any) -> Ref:
    """For engine code: keep ``value`` (array or tensor) on this worker, return its Ref.

    Return the ref (anywhere in a result) to hand the value out by reference."""
    if _CURRENT is None:
        raise RefError("corral.data.keep() works only inside a corral worker")
    return _CURRENT.put(value)


def _describe(value: Any) -> tuple[str, str, tuple[int, ...], int] | None:
    """(kind, dtype, shape, nbytes) of an array or tensor, else None."""
    np = sys.modules.get("numpy")
    if np is not None and isinstance(value, np.ndarray):
        return "nd", str(value.dtype), tuple(value.shape), int(value.nbytes)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        dtype = str(value.dtype).removeprefix("torch.")
        return "pt", dtype, tuple(value.shape), value.numel() * value.element_size()
    return None


class ObjectStore:
    def __init__(self, owner: str, generation: str, trial: str):
        self.owner = owner
        self.generation = generation
        self.trial = trial
        self._values: dict[str, Any] = {}
        self._shared: dict[tuple[str, ...], Any] = {}  # keys -> Reply with a shared segment
        self._building: dict[tuple[str, ...], threading.Lock] = {}
        self._lock = threading.Lock()
        self.on_free = lambda keys: None  # the relay drops its frames of freed keys

    def put(self, value: Any) -> Ref:
        described = _describe(value)
        if described is None:
            raise RefError(
                f"only numpy arrays and torch tensors can be kept by reference, not "
                f"{type(value).__name__}"
            )
        kind, dtype, shape, nbytes = described
        key = secrets.token_hex(16)
        with self._lock:
            self._values[key] = value
        return Ref(self.owner, key, dtype, shape, nbytes, self.generation, self.trial, kind)

    def keep_tree(self, obj: Any, min_bytes: int = 0) -> Any:
        """``obj`` with every array/tensor of at least ``min_bytes`` replaced by a Ref (the
        same object twice gives the same Ref)."""
        seen: dict[int, Ref] = {}

        def walk(x: Any) -> Any:
            if isinstance(x, list):
                return [walk(v) for v in x]
            if isinstance(x, tuple):
                return tuple(walk(v) for v in x)
            if isinstance(x, dict):
                return {k: walk(v) for k, v in x.items()}
            if dataclasses.is_dataclass(x) and not isinstance(x, type):
                changes = {f.name: walk(getattr(x, f.name)) for f in dataclasses.fields(x)}
                return dataclasses.replace(x, **changes)
            described = _describe(x)
            if described is None or described[3] < min_bytes:
                return x
            if id(x) not in seen:
                seen[id(x)] = self.put(x)
            return seen[id(x)]

        return walk(obj)

    def get(self, keys: list[str], trial: str, generation: str) -> list[Any]:
        self.check(trial, generation)
        with self._lock:
            missing = [k for k in keys if k not in self._values]
            if missing:
                raise RefError(
                    f"worker {self.owner} holds no ref with key {missing[0]!r}: it was freed "
                    "(ref.free(), or dropped by the controller) or never made here (a forged "
                    "or mistyped ref)"
                )
            return [self._values[k] for k in keys]

    def split(self, key: str, trial: str, generation: str, spans: list) -> list[Ref]:
        """Refs to rows ``start:stop`` of value ``key``, one per span (views, no copy):
        ``dispatch`` hands each worker its own rows of a ref."""
        (value,) = self.get([key], trial, generation)
        return [self.put(value[int(a) : int(b)]) for a, b in spans]

    def check(self, trial: str, generation: str) -> None:
        if trial != self.trial:
            raise RefError(
                f"the ref belongs to trial {trial!r}, but worker {self.owner} serves trial "
                f"{self.trial!r}: refs cannot cross trials; fetch it with to_local() and pass "
                "the value instead"
            )
        if generation != self.generation:
            raise RefLostError(
                f"the ref was made by an earlier process of worker {self.owner} (generation "
                f"{generation}); that process is gone and its refs with it",
                self.owner,
            )

    def shared_reply(self, keys: list[str], build) -> Any:
        """One reply (with a shared segment) per key set, built once however many ask."""
        ident = tuple(keys)
        with self._lock:
            lock = self._building.setdefault(ident, threading.Lock())
        with lock:
            with self._lock:
                cached = self._shared.get(ident)
            if cached is not None:
                return cached
            reply = build()
            with self._lock:
                if all(k in self._values for k in keys):
                    self._shared[ident] = reply
                self._building.pop(ident, None)
            return reply

    def free(self, keys: list[str]) -> int:
        dropped = 0
        with self._lock:
            for key in keys:
                if self._values.pop(key, None) is not None:
                    dropped += 1
            gone = set(keys)
            for ident in [i for i in self._shared if gone.intersection(i)]:
                reply = self._shared.pop(ident)
                if reply.segment is not None:
                    from corral.rpc import shm

                    shm.POOL.unhold(reply.segment)
        self.on_free(keys)
        return dropped

    def clear(self) -> int:
        return self.free(list(self._values))

    def stats(self) -> dict[str, int]:
        with self._lock:
            total = sum((_describe(v) or ("", "", (), 0))[3] for v in self._values.values())
            return {"refs": len(self._values), "bytes": total, "shared": len(self._shared)}


def parse_keep(value: Any) -> int | None:
    """``rpc_meta['keep']``: True (every array/tensor), an int (those of at least that many
    bytes), or False/None (none). Returns the byte threshold or None."""
    if value is None or value is False:
        return None
    if value is True:
        return 0
    if isinstance(value, int) and value >= 0:
        return value
    raise ConfigError(
        "rpc_meta['keep']",
        value,
        "use True (keep every array/tensor of the result on the worker), a byte threshold "
        "(an int >= 0), or False",
    )


def install(store: ObjectStore) -> None:
    global _CURRENT
    _CURRENT = store
