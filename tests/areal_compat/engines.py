"""Engines the AReaL compatibility tests create on corral workers.

They stand in for AReaL's FSDP/SGLang engines (which need GPUs): same method names and
keyword arguments as AReaL's controllers call, and they report what arrived (the types
the worker rebuilt, the environment) so the tests can check it.
"""

from __future__ import annotations

import dataclasses
import os
import random
from typing import Any

ENV_NAMES = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "PYTHONPATH",
    "TOKENIZERS_PARALLELISM", "CUDA_DEVICE_MAX_CONNECTIONS", "OMP_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES",
)  # fmt: skip


def _type_name(value: Any) -> str:
    return f"{type(value).__module__}.{type(value).__qualname__}"


class RecordingTrainEngine:
    """Answers TrainController's calls (areal/infra/controller/train_controller.py)."""

    def __init__(self, config: Any = None, **kwargs: Any):
        self.config = config
        self.calls: list[str] = ["__init__"]
        self.parallel_strategy: Any = None
        self.ft_spec: Any = None
        self.first_random = random.random()  # seeded by /configure at creation

    def create_process_group(self, parallel_strategy: Any = None) -> None:
        self.calls.append("create_process_group")
        self.parallel_strategy = parallel_strategy

    def initialize(self, ft_spec: Any = None, **kwargs: Any) -> None:
        self.calls.append("initialize")
        self.ft_spec = ft_spec

    def is_data_parallel_head(self) -> bool:
        return True

    def export_stats(self) -> dict[str, float]:
        return {"loss": 0.5}

    def train(self, mode: bool = True) -> None:
        self.calls.append(f"train({mode})")

    def report(self) -> dict[str, Any]:
        return {
            "config_type": _type_name(self.config),
            "config_is_dataclass": dataclasses.is_dataclass(self.config),
            "experiment_name": getattr(self.config, "experiment_name", None),
            "parallel_strategy_type": _type_name(self.parallel_strategy),
            "ft_spec_type": _type_name(self.ft_spec),
            "calls": list(self.calls),
            "env": {name: os.environ.get(name) for name in ENV_NAMES},
            "first_random": self.first_random,
        }

    def destroy(self) -> None:
        self.calls.append("destroy")


class RecordingRolloutEngine:
    """Answers the calls RolloutController makes (rollout_controller.py), without the
    scheduler's own options: a method that received ``http_timeout`` would raise."""

    def __init__(self, config: Any = None):
        self.config = config
        self.tasks: dict[int, Any] = {}

    def initialize(self, engine_id: str, addr: str | None = None) -> str:
        return engine_id

    def submit(self, data: Any, workflow: Any = None, workflow_kwargs: Any = None,
               should_accept_fn: Any = None, is_eval: bool = False,
               group_size: int = 1) -> int:  # fmt: skip
        task_id = len(self.tasks)
        self.tasks[task_id] = data
        return task_id

    def wait_for_task(self, task_id: int, timeout: float = 0.1, raise_timeout: bool = True) -> Any:
        return {"task": task_id, "data": self.tasks.get(task_id)}

    def compute_logp(self, data: list) -> list:
        return [float(len(str(d))) for d in data]

    def config_perf_tracer(self, rank: int, role: str, config: Any = None) -> str:
        return f"{role}:{rank}:{_type_name(config)}"

    def kinds(self, **values: Any) -> dict[str, str]:
        return {k: _type_name(v) for k, v in values.items()}

    def set_version(self, version: int) -> int:
        self.version = version
        return version

    def pause(self) -> None:
        self.paused = True

    def destroy(self) -> None:
        self.tasks.clear()


class SeedProbe:
    """Reports the first number Python's generator gives after the worker was seeded."""

    def __init__(self) -> None:
        self.first = random.random()

    def first_random(self) -> float:
        return self.first


class OrderProbe:
    """Appends its name to a file when destroyed (the teardown order)."""

    def __init__(self, path: str, name: str) -> None:
        self.path, self.name = path, name

    def destroy(self) -> None:
        with open(self.path, "a") as fh:
            fh.write(self.name + "\n")
