"""Engines for the dispatch and weight-sync tests and benchmarks (real workers, real
torch.distributed on the CPU)."""

from __future__ import annotations

import hashlib
import os
from typing import Any

import numpy as np


def shape_of(value: Any) -> Any:
    """What a value is, small enough to send back: kinds, lengths, shapes, bytes."""
    if isinstance(value, dict):
        return {k: shape_of(v) for k, v in value.items()}
    if isinstance(value, list):
        return ["list", len(value)]
    if isinstance(value, tuple):
        return [shape_of(v) for v in value]
    if isinstance(value, np.ndarray):
        return ["ndarray", list(value.shape), int(value.nbytes)]
    if type(value).__name__ == "Tensor":
        return ["tensor", list(value.shape), value.numel() * value.element_size()]
    return ["value", value]


class ShardEngine:
    """Records what each call brought; ``whoami`` names the worker it was created on."""

    def __init__(self, worker_id: str = "") -> None:
        self.worker_id = worker_id
        self.got: list[Any] = []

    def whoami(self, *args: Any, **kwargs: Any) -> str:
        return self.worker_id

    def shapes(self, *args: Any, **kwargs: Any) -> dict:
        seen = {
            "worker": self.worker_id,
            "args": [shape_of(a) for a in args],
            "kwargs": shape_of(kwargs),
        }
        self.got.append(seen)
        return seen

    def calls(self) -> int:
        """How many ``shapes`` calls reached this engine."""
        return len(self.got)

    def echo(self, value: Any, **kwargs: Any) -> Any:
        return value

    def double(self, value: Any) -> Any:
        return value * 2

    def rows(self, value: Any) -> int:
        return len(value)

    def die_on(self, worker_id: str, value: Any = None) -> Any:
        """Exit (code 3) on ``worker_id``; the others return ``value`` doubled."""
        if worker_id == self.worker_id:
            os._exit(3)
        return value * 2

    def batch(self, rows: int, cols: int) -> np.ndarray:
        return np.arange(rows * cols, dtype=np.float32).reshape(rows, cols)


class WeightEngine:
    """A "model" of fp32 tensors; pushes or pulls it through a corral process group."""

    def __init__(self, worker_id: str = "") -> None:
        self.worker_id = worker_id
        self.state: dict = {}

    def make(self, mbytes: float, seed: int = 0, tensors: int = 8) -> str:
        """A state dict of ``tensors`` random fp32 tensors, ``mbytes`` MB in all."""
        import torch

        gen = torch.Generator().manual_seed(seed)
        per = int(mbytes * 1e6) // 4 // tensors
        self.state = {f"layer{i}.weight": torch.randn(per, generator=gen) for i in range(tensors)}
        return self.digest()

    def zeros_like(self, mbytes: float, tensors: int = 8) -> str:
        import torch

        per = int(mbytes * 1e6) // 4 // tensors
        self.state = {f"layer{i}.weight": torch.zeros(per) for i in range(tensors)}
        return self.digest()

    def digest(self) -> str:
        h = hashlib.sha256()
        for key in sorted(self.state):
            h.update(key.encode())
            h.update(self.state[key].contiguous().numpy().tobytes())
        return h.hexdigest()

    def push(self, group: str, src: int = 0) -> str:
        from corral.groups import process_group

        process_group(group).broadcast_state_dict(self.state, src=src)
        return self.digest()

    def place(self, group: str) -> str:
        """Move the state into the group's shared memory (``ProcessGroup.place``)."""
        from corral.groups import process_group

        keys = sorted(self.state)
        views = process_group(group).place([self.state[k] for k in keys])
        self.state = dict(zip(keys, views, strict=True))
        return self.digest()

    def pull(self, group: str, src: int = 0, in_place: bool = True) -> str:
        from corral.groups import process_group

        pg = process_group(group)
        self.state = pg.broadcast_state_dict(self.state if in_place else None, src=src)
        return self.digest()

    def group(self, name: str) -> dict:
        from corral.groups import process_group
        from corral.rpc import shm

        pg = process_group(name)
        return {
            "rank": pg.rank,
            "world_size": pg.world_size,
            "members": pg.members,
            "host_token": shm.host_token(),
            "last_path": pg.last_path,  # how the last broadcast moved its bytes
            "maps_segment": shm.mapped_segments() > 0,
        }

    def dist_broadcast(self, name: str, value: float) -> float:
        """torch.distributed's own broadcast over the corral group, by group rank."""
        import torch
        import torch.distributed as dist

        from corral.groups import process_group

        tensor = torch.full((4,), float(value))
        dist.broadcast(tensor, group=process_group(name).group, group_src=0)
        return float(tensor[0])

    def default_group_initialized(self) -> bool:
        import torch.distributed as dist

        return dist.is_initialized()

    # the benchmark's other ways ---------------------------------------------------
    def send(self, group: str) -> int:
        """Broadcast the state dict from group rank 0 (no digest: the benchmark's way)."""
        from corral.groups import process_group

        process_group(group).broadcast_state_dict(self.state, src=0)
        return sum(v.numel() * 4 for v in self.state.values())

    def receive(self, group: str) -> int:
        """Receive a state dict into new tensors (written: every page is in), drop it."""
        from corral.groups import process_group

        got = process_group(group).broadcast_state_dict(None, src=0)
        return sum(v.numel() * v.element_size() for v in got.values())

    def state_nbytes(self) -> int:
        return sum(v.numel() * v.element_size() for v in self.state.values())

    def touch(self, value: Any) -> int:
        """Read one element of every 4 KiB page of an array (a consumer's page-ins)."""
        flat = np.asarray(value).reshape(-1).view(np.uint8)
        return int(flat[::4096].sum() >= 0) * int(flat.nbytes)

    def state_array(self) -> np.ndarray:
        """The state dict as one flat fp32 array (kept by ref, or returned); made once."""
        import torch

        if getattr(self, "_flat", None) is None:
            self._flat = torch.cat([self.state[k] for k in sorted(self.state)]).numpy()
        return self._flat

    def load_array(self, flat: Any) -> int:
        """Take the weights from one flat array (what the ref and controller ways send)."""
        import torch

        flat = torch.from_numpy(np.asarray(flat))
        offset = 0
        for key in sorted(self.state):
            n = self.state[key].numel()
            self.state[key].copy_(flat[offset : offset + n])
            offset += n
        return offset
