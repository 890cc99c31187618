"""What the conformance suite needs from a backend under test.

Each backend module (backend_local.py, backend_ray.py, backend_slurm.py) defines a
fixture ``<name>_backend`` that returns a ``BackendUnderTest``. The suite is parametrised
over ``CORRAL_TEST_BACKENDS`` (default: local,ray,slurm).
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import pytest

from corral import BaseExperimentConfig
from corral.controller.scheduler import Scheduler
from corral.procs import pid_alive  # noqa: F401  (re-exported for the tests)
from corral.spec import Worker


def sigint_not_ignored() -> None:
    """``preexec_fn`` for a child that a test stops with SIGINT (Ctrl-C): a shell that runs
    the suite as a background job starts it with SIGINT ignored, which the child would
    inherit (and Python then installs no KeyboardInterrupt handler)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def require_service(name: str, why: str) -> None:
    """Skip on a developer machine without the service; fail loudly in CI."""
    if os.environ.get("CI"):
        pytest.fail(f"{name} is required in CI but unavailable: {why}")
    pytest.skip(f"{name} unavailable: {why}")


def node_of(sched, wid: str) -> str:
    """The node a worker runs on, as its backend names it (not as the worker reports it)."""
    if sched.backend == "ray":
        role, index = wid.split("/")
        return sched.launcher.placement(role, int(index))["node_id"]
    if sched.backend == "slurm":
        return sched.call_engine(wid, "getenv", "e", "SLURMD_NODENAME")
    return "localhost"


class Preemption(Protocol):
    """How a backend under test preempts a role the way its cluster would, then gives the
    role its resources back (tests/conformance/test_preemption.py)."""

    heard: str
    """What the engines' ``on_preempt`` is told (a part of it)."""

    def job(self, role: str, replicas: int, **spec: Any) -> Any:
        """A job whose workers this procedure can preempt."""

    def warn(self, sched: Scheduler, role: str) -> None:
        """The cluster announces the preemption (engines hear ``on_preempt``)."""

    def take(self, sched: Scheduler, role: str) -> None:
        """The cluster takes the workers away."""

    def give_back(self, sched: Scheduler, role: str) -> None:
        """The cluster has room for the role again."""

    def check_back(self, sched: Scheduler, role: str) -> None:
        """Backend-specific checks once the role is back."""


@dataclass
class BackendUnderTest:
    name: str
    make: Callable[..., Scheduler]
    gpus_per_node: int = 4
    nodes: int = 1
    fileroot: str = "/tmp/corral-conformance"
    controller_env: dict = field(default_factory=dict)
    leftovers: Callable[[str, str], list[str]] = field(default=lambda exp, trial: [])
    lacks: dict[str, str] = field(default_factory=dict)
    """Capabilities this backend does not have, each with why (see ``require``)."""
    preemption: Callable[[], Any] | None = None
    """A context manager that yields this backend's way to take a role away and give it
    back (a ``Preemption``); None where the backend lacks ``preemption``."""

    def require(self, capability: str) -> None:
        """Skip a conformance case whose behaviour this backend lacks, saying which and why."""
        if capability in self.lacks:
            pytest.skip(f"the {self.name} backend lacks {capability}: {self.lacks[capability]}")

    def scheduler(
        self,
        name_resolve: dict | None = None,
        experiment: str | None = None,
        trial: str | None = None,
        **kwargs,
    ) -> Scheduler:
        """A scheduler for a fresh trial (or the names given); ``name_resolve`` overrides
        cluster.name_resolve."""
        experiment = experiment or f"conf-{self.name}"
        trial = trial or f"t{uuid.uuid4().hex[:8]}"
        cfg = BaseExperimentConfig(experiment_name=experiment, trial_name=trial)
        # a config's n_gpus_per_node wins over the keyword (as in AReaL): put it there
        cfg.cluster.n_gpus_per_node = kwargs.pop("n_gpus_per_node", self.gpus_per_node)
        for key, value in (name_resolve or {}).items():
            setattr(cfg.cluster.name_resolve, key, value)
        return self.make(cfg, **kwargs)

    def kill_worker(self, worker: Worker, sig: int = signal.SIGKILL) -> None:
        """Every test backend runs on this machine, so the worker's pid is ours to signal."""
        assert worker.pid, f"worker {worker.id} did not report its pid"
        os.kill(worker.pid, sig)
