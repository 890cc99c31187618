"""The backend registry: a backend's name -> where its Scheduler class lives.

Config (``scheduler.type``), the CLI (``--scheduler`` choices, ``run --dry-run``) and
``corral``'s lazy attributes all read this one table. Nothing here imports a backend: the
class is imported on first use, so ``import corral`` stays cheap and no module that a
backend imports (config, scheduler) has to import the backends back.
"""

from __future__ import annotations

import importlib
from typing import Any

from corral.errors import ConfigError

#: name -> "module:Class". Add a backend by adding a line here.
BACKENDS: dict[str, str] = {
    "local": "corral.backends.local:LocalScheduler",
    "ray": "corral.backends.ray.scheduler:RayScheduler",
    "slurm": "corral.backends.slurm.scheduler:SlurmScheduler",
}


#: name -> "module:function(experiment, trial) -> list[str]": what ``corral stop`` asks a
#: backend to remove of a trial whose controller is gone (one printable line per thing
#: removed). A backend with nothing to remove from outside a controller has no line.
TRIAL_LEFTOVERS: dict[str, str] = {
    "slurm": "corral.backends.slurm.leftover_jobs:stop_trial_leftovers",
}


def stop_trial_leftovers(experiment: str, trial: str) -> list[str]:
    """Ask every backend of :data:`TRIAL_LEFTOVERS` to remove what a trial left; their
    lines, in the table's order."""
    lines: list[str] = []
    for target in TRIAL_LEFTOVERS.values():
        module, _, function = target.partition(":")
        lines += getattr(importlib.import_module(module), function)(experiment, trial)
    return lines


def backend_names() -> tuple[str, ...]:
    return tuple(BACKENDS)


def class_path(name: str) -> tuple[str, str]:
    """``("corral.backends.ray.scheduler", "RayScheduler")`` for ``"ray"``; ConfigError if unknown."""
    target = BACKENDS.get(name)
    if target is None:
        raise ConfigError("scheduler.type", name, f"use one of {', '.join(BACKENDS)}")
    module, _, cls = target.partition(":")
    return module, cls


def scheduler_class(name: str) -> Any:
    """The Scheduler class registered as ``name``, imported now."""
    module, cls = class_path(name)
    return getattr(importlib.import_module(module), cls)


def lazy_exports() -> dict[str, str]:
    """Class name -> module, for ``corral.__getattr__``."""
    return {cls: module for module, cls in (class_path(n) for n in BACKENDS)}
