"""The state the Slurm launcher's parts share: each role's jobs and spec, the restart
steps running inside jobs, and the one lock over them (:class:`RoleJobs`)."""

from __future__ import annotations

import subprocess
import threading
from dataclasses import dataclass, field

from corral.spec import NormalizedJob


@dataclass
class RoleJob:
    """One sbatch job of a role: the role's first job, or one that restarted a replica."""

    job_id: str
    indices: list[int]
    """The replicas this job runs now (a restarted replica moves to its own job)."""
    log_dir: str
    script: str
    seen_active: bool = False
    requeues_seen: int = 0
    exits_seen: set[int] = field(default_factory=set)
    """Replicas whose exit file was seen (the job's state is looked up afresh for a new one)."""


class RoleJobs:
    """Role -> its jobs (the first one, then one per restarted replica or grown part) and
    its spec; the ``srun --overlap`` clients of replicas restarted as steps.

    Every part of the launcher (watch, stop, restart, elastic, preemption, adoption)
    receives this one object; a compound change holds ``lock``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_role: dict[str, list[RoleJob]] = {}
        self.specs: dict[str, NormalizedJob] = {}
        self.steps: dict[tuple[str, int], subprocess.Popen] = {}

    def of(self, role: str) -> list[RoleJob]:
        """The role's jobs (a copy of the list; the jobs themselves are shared)."""
        with self.lock:
            return list(self.by_role.get(role, ()))

    def live(self, role: str) -> list[RoleJob]:
        """The role's jobs that still run a replica."""
        return [j for j in self.of(role) if j.indices]

    def live_ids(self) -> list[str]:
        """Every job of every role that still runs a replica (one squeue asks for all)."""
        with self.lock:
            return [j.job_id for jobs in self.by_role.values() for j in jobs if j.indices]

    def ids(self, role: str) -> list[str]:
        return [j.job_id for j in self.of(role)]

    def first_ids(self) -> dict[str, str]:
        """Role -> its first job id."""
        with self.lock:
            return {role: jobs[0].job_id for role, jobs in self.by_role.items() if jobs}

    def spec(self, role: str) -> NormalizedJob | None:
        with self.lock:
            return self.specs.get(role)

    def roles(self) -> list[str]:
        with self.lock:
            return list(self.by_role)
