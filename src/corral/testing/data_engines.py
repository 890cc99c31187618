"""An engine for the data-plane tests and benchmarks: makes, inspects and echoes arrays."""

from __future__ import annotations

from typing import Any

import numpy as np

from corral.data import keep
from corral.rpc import shm


def _first_array(value: Any) -> Any:
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list | tuple):
        for item in value:
            found = _first_array(item)
            if found is not None:
                return found
        return None
    return value if hasattr(value, "nbytes") else None


class DataEngine:
    def __init__(self, initial: Any = None) -> None:
        self.held: Any = initial

    def destroy_held(self) -> None:
        self.held = None

    def hold(self, value: Any) -> bool:
        """Keep the array received; True if it is a view of a shared-memory segment."""
        self.held = _first_array([value])
        return shm.in_segment(self.held)

    def held_sum(self) -> float:
        return float(np.asarray(self.held).sum())

    def held_nbytes(self) -> int:
        return int(self.held.nbytes) if isinstance(self.held, np.ndarray) else -1

    def make(self, nbytes: int) -> dict:
        big = np.arange(nbytes // 4, dtype=np.float32)
        return {"big": big, "nested": [{"small": big[:16].copy()}], "count": 7}

    def make_ref(self, nbytes: int) -> Any:
        return keep(np.ones(nbytes // 4, dtype=np.float32))

    def array(self, nbytes: int) -> np.ndarray:
        """The same array every call (so producing it costs nothing in benchmarks)."""
        if self.held is None or self.held.nbytes != nbytes:
            self.held = np.arange(nbytes // 4, dtype=np.float32)
        return self.held

    def describe(self, value: Any) -> dict:
        arr = _first_array(value)
        flat = np.asarray(arr).reshape(-1)
        return {
            "type": type(arr).__name__,
            "nbytes": int(arr.nbytes),
            "first": float(flat[0]),
            "last": float(flat[-1]),
        }

    def digest(self, value: Any) -> str:
        """sha256 of the bytes of the first array received (readers compare the owner's)."""
        import hashlib

        return hashlib.sha256(np.ascontiguousarray(_first_array(value)).data).hexdigest()

    def touch(self, value: Any) -> float:
        """Read one element of every 4 KiB page of the first array (every page is brought
        in, as a consumer would) and return their sum."""
        flat = np.asarray(_first_array(value)).reshape(-1).view(np.uint8)
        return float(flat[::4096].sum())

    def echo(self, value: Any) -> Any:
        return value

    def noop(self) -> None:
        return None

    def in_shared_memory(self, value: Any) -> bool:
        """Whether the array this method received is a view of a shared-memory segment."""
        return shm.in_segment(_first_array([value]))

    def segments_mapped(self, _value: Any) -> int:
        """How many shared-memory segments this process maps while it holds ``_value``."""
        return shm.mapped_segments()
