"""What a backend must answer. Everything else lives in the shared Scheduler."""

from __future__ import annotations

import abc
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from corral.spec import NormalizedJob, Worker


@dataclass
class WorkerExit:
    """Why a worker is no longer alive."""

    reason: str
    exit_code: int | None = None
    log_path: str | None = None
    preempted: bool = False
    """The backend took the worker away and will bring it back (Slurm requeue):
    calls raise WorkerPreemptedError; ``Scheduler.wait_role`` waits for the return."""


@dataclass
class LaunchRequest:
    """Start ``job.replicas`` workers of ``job.role``; ``envs[i]`` is replica i's environment."""

    job: NormalizedJob
    envs: list[dict[str, str]]
    log_dir: str


@dataclass
class ForkRequest:
    """Start worker ``role/index`` next to ``target`` (same host and devices), running
    module ``command`` (default: the corral worker) with ``env`` added.

    ``via_worker()`` is the shared way, which every backend can use: the target worker
    starts the child itself (``POST /fork``) and it is returned once registered."""

    role: str
    index: int
    target: Worker
    env: dict[str, str]
    command: str | None
    via_worker: Callable[[], Worker]


class Launcher(abc.ABC):
    """A backend: places and starts workers, tells whether they live, stops them.

    Each method answers one question (the first line of its docstring). ``launch``,
    ``poll`` and ``stop`` must be written; the others have defaults that suit a backend
    whose workers share the controller's filesystem and cannot be restarted."""

    name: str = "base"
    fds_per_worker: int = 1
    """Open files the controller holds per worker of this backend (see corral.fdlimit)."""
    shares_filesystem: bool = True
    """Can workers read the controller's fileroot? If not, the launcher hands
    ``trial_secret`` to each worker itself (Ray: an actor argument), never in an env."""
    trial_secret: str = ""  # set by the scheduler
    outlive: float = 0.0
    """Set by the scheduler: seconds the workers outlive their controller (corral.controller.adoption)."""
    # The optional capabilities, each a part object (corral.capabilities); None: cannot.
    elastic: Any = None
    preemption: Any = None
    adoption: Any = None
    commands: Any = None
    multi_node: bool = False
    news: Any = None
    """A ``threading.Event`` the backend sets when a worker may have registered (local: a
    worker's output arrived; it prints ``serving at`` once its records are written), so
    the wait for registrations looks then, not at its next poll; None: polls only."""

    def progress(self, text: str) -> None:
        """Progress lines (pending reasons while waiting); the Scheduler replaces this."""

    def check(self, job: NormalizedJob) -> None:
        """Can this backend ever place ``job``? Raise ConfigError before anything starts."""

    def describe(self, request: LaunchRequest) -> str:
        """What would ``launch(request)`` ask the backend for? Printable; starts nothing."""
        lines = [f"# dry run ({self.name}): {request.job.replicas} {request.job.role} worker(s)"]
        for index, env in enumerate(request.envs):
            lines += [f"## {request.job.role}/{index}", *env_lines(env)]
        return "\n".join(lines)

    @abc.abstractmethod
    def launch(self, request: LaunchRequest) -> None:
        """Start these workers (they register themselves in name-resolve)."""

    @abc.abstractmethod
    def poll(self, role: str) -> dict[int, WorkerExit]:
        """Which replicas of ``role`` have died, and why? Empty while all live or wait."""

    def pending_reason(self, role: str) -> str | None:
        """Why have the role's workers not started yet (queue reasons), if known?"""
        return None

    def hopeless(self, role: str) -> str | None:
        """Can the role's queued workers never start? Then why (the backend has withdrawn
        the request)."""
        return None

    @abc.abstractmethod
    def stop(self, role: str, reverse: bool = False) -> None:
        """Stop every process of ``role`` (``reverse``: highest rank first) and wait
        until they are gone."""

    def restart(self, role: str, index: int, env: dict[str, str]) -> None:
        """Start replica ``index`` of ``role`` again, in its old place, with ``env``."""
        raise NotImplementedError(f"the {self.name} backend cannot restart workers")

    def fork(self, request: ForkRequest) -> Worker:
        """Start a worker next to ``request.target``; returned once registered."""
        return request.via_worker()

    def stop_fork(self, worker: Worker, via_worker: Callable[[], None]) -> None:
        """Stop a worker that ``fork`` made (``via_worker``: ask its host worker)."""
        via_worker()

    def rendezvous_master(self, role: str, workers: list[Worker]) -> tuple[str, int] | None:
        """Where does rank 0 listen for torch.distributed? Default: its first reserved
        port (``worker_ports[1]``, the port AReaL's TrainController uses too)."""
        first = workers[0]
        return (first.ip, first.reserved_ports[0]) if first.reserved_ports else None

    def remove_leftovers(self, experiment: str, trial: str) -> list[str]:
        """What did a dead controller of this trial leave in the backend (jobs, actors,
        groups)? Remove it; one line per thing removed."""
        return []

    def close(self) -> None:
        """Release what this launcher started (runtimes)."""


def can_restart(launcher: Launcher) -> bool:
    """Does the backend implement ``restart``?"""
    return type(launcher).restart is not Launcher.restart


def env_lines(env: dict[str, str], indent: str = "    ") -> list[str]:
    """A worker environment as sorted, shell-quoted ``NAME=value`` lines (dry runs)."""
    return [f"{indent}{name}={shlex.quote(value)}" for name, value in sorted(env.items())]
