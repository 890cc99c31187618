"""What a backend must answer. Everything else lives in the shared Scheduler."""

from __future__ import annotations

import abc
import shlex
from dataclasses import dataclass, field

from corral.spec import NormalizedJob, Worker


@dataclass
class WorkerExit:
    """Why a worker is no longer alive."""

    reason: str
    exit_code: int | None = None
    log_path: str | None = None


@dataclass
class LaunchRequest:
    """Start ``job.replicas`` workers of ``job.role``; ``envs[i]`` is replica i's environment."""

    job: NormalizedJob
    envs: list[dict[str, str]]
    log_dir: str
    extra: dict = field(default_factory=dict)


class Launcher(abc.ABC):
    """A backend: places and starts workers, tells whether they live, stops them."""

    name: str = "base"
    # Set by the scheduler. A launcher whose workers cannot read the controller's fileroot
    # (share_secret_by_env) hands it to each worker itself, never in an environment.
    trial_secret: str = ""
    fds_per_worker: int = 1
    """Open files the controller holds per worker of this backend (see corral.fdlimit)."""

    def progress(self, text: str) -> None:
        """Progress lines (pending reasons while waiting); the Scheduler replaces this."""

    def check(self, job: NormalizedJob) -> None:
        """Backend-specific validation; raise ConfigError before anything starts."""

    def describe(self, request: LaunchRequest) -> str:
        """What would ``launch(request)`` ask the backend for? Printable; starts nothing."""
        lines = [f"# dry run ({self.name}): {request.job.replicas} {request.job.role} worker(s)"]
        for index, env in enumerate(request.envs):
            lines += [f"## {request.job.role}/{index}", *env_lines(env)]
        return "\n".join(lines)

    @abc.abstractmethod
    def launch(self, request: LaunchRequest) -> None:
        """Start the workers (they register themselves in name-resolve)."""

    @abc.abstractmethod
    def poll(self, role: str) -> dict[int, WorkerExit]:
        """Replicas of ``role`` known to have died, by index. Empty if all live or pending."""

    def pending_reason(self, role: str) -> str | None:
        """Why the role's workers have not started yet, if the backend knows (queue reasons)."""
        return None

    def hopeless(self, role: str) -> str | None:
        """Why the role's queued workers can never start (a queue reason that cannot
        clear), if so; the backend has then withdrawn the request."""
        return None

    @abc.abstractmethod
    def stop(self, role: str) -> None:
        """Stop every process of ``role`` and wait until they are gone."""

    def restart(self, role: str, index: int, env: dict[str, str]) -> None:
        """Start replica ``index`` of ``role`` again, in its old place, with ``env``."""
        raise NotImplementedError(f"the {self.name} backend cannot restart workers")

    def supports_restart(self) -> bool:
        return type(self).restart is not Launcher.restart

    def backend_id(self, role: str, index: int) -> str | None:
        return None

    def fork(
        self, role: str, target: Worker, index: int, env: dict[str, str], command: str | None = None
    ) -> Worker | None:
        """Start a worker next to ``target`` (running module ``command`` if given).
        None: use the shared ``POST /fork`` path."""
        return None

    def kill_fork(self, worker: Worker) -> bool:
        """Stop a worker made by ``fork``. False: use the shared ``/kill_forked_worker`` path."""
        return False

    def rendezvous_master(self, role: str, workers: list[Worker]) -> tuple[str, int] | None:
        """MASTER_ADDR and MASTER_PORT for the role; default: rank 0's first reserved port
        (``worker_ports[1]``, the port AReaL's TrainController uses too)."""
        first = workers[0]
        return (first.ip, first.reserved_ports[0]) if first.reserved_ports else None

    def stop_in_reverse(self, role: str) -> None:
        """Stop the role's workers from the highest rank down (``reverse_order``); default:
        ``stop`` (backends that stop a role at once, such as one Slurm job, need no order)."""
        self.stop(role)

    def share_secret_by_env(self) -> bool:
        """True if workers cannot read the controller's fileroot (no shared filesystem): the
        launcher then hands ``trial_secret`` to each worker itself (Ray: actor arguments)."""
        return False

    def remove_leftovers(self, experiment: str, trial: str) -> list[str]:
        """Remove what a dead controller of this trial left in the backend (jobs, actors,
        groups named after the trial); one line per thing removed."""
        return []

    def close(self) -> None:
        """Release backend resources (runtimes this launcher started)."""


def env_lines(env: dict[str, str], indent: str = "    ") -> list[str]:
    """A worker environment as sorted, shell-quoted ``NAME=value`` lines (dry runs)."""
    return [f"{indent}{name}={shlex.quote(value)}" for name, value in sorted(env.items())]
