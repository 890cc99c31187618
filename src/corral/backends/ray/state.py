"""What the parts of the Ray backend share: one :class:`RayState` per launcher, made by
``RayLauncher`` and handed to each part (actors, groups, poll, teardown, elastic, forks,
node loss, adoption), which reads and changes only what it is given. The records of a
role's replicas and groups, and the names of a trial's groups and actors, live here too."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from corral.backends.backend_options import RayOptions
from corral.launcher import WorkerExit

NAMESPACE = "corral"  # of the detached actors of runs that outlive their controller


def name_prefix(experiment: str, trial: str) -> str:
    """Every placement group and actor of a trial is named ``<prefix>:<role>[:<index>]``."""
    return f"corral:{experiment}:{trial}"


@dataclass
class Replica:
    """One worker's actor: where it runs (group, bundle) and what became of it."""

    role: str
    index: int
    name: str
    actor: Any
    done_ref: Any
    info_ref: Any
    env: dict[str, str]
    pg: Any
    bundle_index: int
    spec: Any
    kind: str | None  # the accelerator resource of its bundle (GPU, NPU) if it uses one
    log_dir: str
    parent: tuple[str, int] | None = None
    info: dict | None = None
    exit: WorkerExit | None = None


@dataclass
class RoleRecord:
    """A role's replicas and the placement groups (with their bundles) they stand on."""

    replicas: list[Replica] = field(default_factory=list)
    pgs: list[Any] = field(default_factory=list)
    bundles: list[list[dict]] = field(default_factory=list)
    strategy: str = "separate"


def _silent(text: str) -> None:
    pass


@dataclass
class RayState:
    """The Ray handle, the options, the settings the scheduler gives the launcher, and
    the role tables under one lock."""

    ray: Any  # the ray module; None in a dry run (Ray is not imported)
    options: RayOptions
    requeue: bool = False
    startup_timeout: float = 120.0
    n_gpus_per_node: int = 0  # multi-node workers (corral.multinode)
    outlive: float = (
        0.0  # seconds the workers outlive their controller (corral.controller.adoption)
    )
    trial_secret: str = ""
    progress: Callable[[str], None] = _silent
    own_cluster: bool = False  # a local runtime that ends with this process
    started_runtime: bool = False  # ray.init was called by this launcher
    roles: dict[str, RoleRecord] = field(default_factory=dict)
    forks: dict[str, RoleRecord] = field(default_factory=dict)
    """Forked children and the members of multi-node instances, by role."""
    lock: threading.RLock = field(default_factory=threading.RLock)

    def records(self, role: str) -> list[Replica]:
        """The replicas of a launched, forked or member role (a copy)."""
        with self.lock:
            record = self.roles.get(role) or self.forks.get(role)
            return list(record.replicas) if record else []

    def find(self, role: str, index: int) -> Replica | None:
        return next((r for r in self.records(role) if r.index == index), None)

    def info(self, replica: Replica, timeout: float) -> dict:
        """What the replica's actor reported about itself (node, group, pid, devices)."""
        if replica.info is None:
            replica.info = self.ray.get(replica.info_ref, timeout=timeout)
        return replica.info
