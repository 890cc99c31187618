"""corral: launch, reach and retire the workers of distributed training jobs.

The same API on a laptop (LocalScheduler), a Ray cluster (RayScheduler) or a Slurm
cluster (SlurmScheduler). Every public name is imported on first use (``_EXPORTS``), so
``import corral`` costs next to nothing and a worker process, which imports
``corral.worker``, loads none of the controller's modules (config, spec, backends).
"""

from __future__ import annotations

__version__ = "0.1.0"

_CONFIG = ("BaseExperimentConfig", "ClusterSpecConfig", "NameResolveConfig", "SchedulerConfig",
           "load_expr_config", "make_scheduler")  # fmt: skip
_SPEC = ("Job", "SchedulingSpec", "SchedulingStrategy", "SchedulingStrategyType", "Worker")
_ERRORS = (
    "ConfigError", "CorralError", "EngineCallError", "EngineCreationError", "EngineImportError",
    "GPUAllocationError", "PlacementError", "PortAllocationError", "RefError", "RefLostError",
    "ResourceLimitError", "RPCConnectionError", "SchedulerError", "TrialInUseError", "ProcessGroupError",
    "WorkerConfigurationError", "WorkerConnectionError", "WorkerCreationError",
    "WorkerFailedError", "WorkerNotFoundError", "WorkerPreemptedError", "WorkerTimeoutError",
)  # fmt: skip

#: public name -> the module that defines it (the backends' classes come from their registry)
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(_CONFIG, "corral.config"),
    **dict.fromkeys(_SPEC, "corral.spec"),
    **dict.fromkeys(_ERRORS, "corral.errors"),
    "Ref": "corral.rpc.ref",
    "Scheduler": "corral.controller.scheduler",
}


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None and name[:1].isupper():  # not `from corral import spec` (a submodule)
        from corral.backends import lazy_exports

        module = lazy_exports().get(name)
    if module is None:
        raise AttributeError(f"module 'corral' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    *_CONFIG, *_SPEC, "Scheduler", "LocalScheduler", "RayScheduler", "SlurmScheduler", *_ERRORS,
    "Ref",
]  # fmt: skip
