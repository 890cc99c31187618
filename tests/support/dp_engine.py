"""A training engine with AReaL's TrainEngine interface, on real torch.distributed (gloo, CPU).

The ranks of a role form one process group from the variables corral sets on its workers
(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT). Consecutive blocks of ``group_size`` ranks
are one model replica (its context-and-model-parallel group); the first rank of a block
is its data-parallel head. Used by the broadcast tests (tests/conformance/
test_dp_broadcast.py, tests/areal_compat/test_dp_broadcast.py).
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any


class DPGroupEngine:
    def __init__(self, config: Any = None, **_: Any) -> None:
        self.config = config
        self._initialized = False
        self.rank = int(os.environ["RANK"])
        self.world_size = int(os.environ["WORLD_SIZE"])
        self.group_size = 1
        self._group: Any = None
        self.calls: list[dict] = []

    # AReaL's TrainEngine interface ------------------------------------------------
    def create_process_group(self, parallel_strategy: Any = None, group_size: int = 0) -> None:
        """Join the role's gloo group; ``group_size`` (or AReaL's ParallelStrategy: its
        world size over its data-parallel size) ranks per replica."""
        import torch.distributed as dist

        if not group_size and parallel_strategy is not None:
            group_size = parallel_strategy.world_size // parallel_strategy.dp_size
        self.group_size = group_size or 1
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
            rank=self.rank,
            world_size=self.world_size,
            timeout=timedelta(seconds=120),
        )
        for start in range(0, self.world_size, self.group_size):  # every rank makes every group
            group = dist.new_group(list(range(start, start + self.group_size)))
            if start <= self.rank < start + self.group_size:
                self._group = group

    def initialize(self, *args: Any, **kwargs: Any) -> None:
        self._initialized = True

    @property
    def initialized(self) -> bool:
        return self._initialized

    def current_data_parallel_head(self) -> int:
        return self.rank - self.rank % self.group_size

    @property
    def data_parallel_rank(self) -> int:
        return self.rank // self.group_size

    @property
    def data_parallel_world_size(self) -> int:
        return self.world_size // self.group_size

    def is_data_parallel_head(self) -> bool:
        return self.rank == self.current_data_parallel_head()

    @property
    def context_and_model_parallel_group(self) -> Any:
        return self._group

    # what the tests call ---------------------------------------------------------
    def received(self, *args: Any, **kwargs: Any) -> dict:
        """Records and returns what this rank was called with."""
        call = {"rank": self.rank, "args": list(args), "kwargs": dict(kwargs)}
        self.calls.append(call)
        return call

    def train_lm(self, *args: Any, **kwargs: Any) -> None:
        """LMController.train_lm's engine method (areal/trainer/sft/lm_engine.py:53)."""
        self.received(*args, **kwargs)

    def train(self, mode: bool = True) -> None:
        """TrainController.train's engine method."""
        self.received(mode)

    def history(self) -> list[dict]:
        return list(self.calls)

    def destroy(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
