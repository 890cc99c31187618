"""corral: launch, reach and retire the workers of distributed training jobs.

The same API on a laptop (LocalScheduler), a Ray cluster (RayScheduler) or a Slurm
cluster (SlurmScheduler). Backends other than local are imported only when used.
"""

from __future__ import annotations

from typing import Any

from corral.backends import lazy_exports
from corral.config import (
    BaseExperimentConfig,
    ClusterSpecConfig,
    NameResolveConfig,
    SchedulerConfig,
    load_expr_config,
    make_scheduler,
)
from corral.data.ref import Ref
from corral.errors import (
    ConfigError,
    CorralError,
    EngineCallError,
    EngineCreationError,
    EngineImportError,
    GPUAllocationError,
    PlacementError,
    PortAllocationError,
    ProcessGroupError,
    RefError,
    RefLostError,
    ResourceLimitError,
    RPCConnectionError,
    SchedulerError,
    TrialInUseError,
    WorkerConfigurationError,
    WorkerConnectionError,
    WorkerCreationError,
    WorkerFailedError,
    WorkerNotFoundError,
    WorkerPreemptedError,
    WorkerTimeoutError,
)
from corral.spec import Job, SchedulingSpec, SchedulingStrategy, SchedulingStrategyType, Worker

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    module = {"Scheduler": "corral.scheduler", **lazy_exports()}.get(name)
    if module is None:
        raise AttributeError(f"module 'corral' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [
    "BaseExperimentConfig", "ClusterSpecConfig", "NameResolveConfig", "SchedulerConfig",
    "load_expr_config", "make_scheduler", "Job", "SchedulingSpec", "SchedulingStrategy",
    "Worker", "Scheduler", "LocalScheduler", "RayScheduler", "SlurmScheduler",
    "CorralError", "ConfigError", "SchedulerError", "WorkerCreationError", "WorkerTimeoutError",
    "WorkerFailedError", "WorkerNotFoundError", "EngineCreationError", "EngineImportError",
    "EngineCallError", "SchedulingStrategyType", "WorkerConfigurationError",
    "WorkerConnectionError", "PortAllocationError", "GPUAllocationError", "RPCConnectionError",
    "EngineCallError", "TrialInUseError", "PlacementError", "ResourceLimitError", "WorkerPreemptedError",
    "Ref", "RefError", "RefLostError", "ProcessGroupError",
]  # fmt: skip
