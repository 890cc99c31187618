"""The controller's table of roles and workers, and the checks a new role must pass."""

from __future__ import annotations

from dataclasses import dataclass, field

from corral.errors import (
    ConfigError,
    JobConfigError,
    UnknownRoleError,
    WorkerFailedError,
    WorkerNotFoundError,
)
from corral.grouping import check_grouped, is_grouped
from corral.launcher import Launcher, can_restart
from corral.multinode import check_multinode
from corral.spec import NormalizedJob, Worker

LAUNCHED, FORKED, REUSED = "launched", "forked", "reused"


@dataclass
class RoleState:
    job: NormalizedJob
    workers: list[Worker]
    kind: str  # LAUNCHED | FORKED | REUSED
    target: str | None = None
    pending: bool = False  # launched, not yet registered (create_workers(wait=False))
    engines: dict[str, set[str]] = field(default_factory=dict)
    restarts: dict[int, int] = field(default_factory=dict)
    instances: list = field(default_factory=list)
    """Multi-node roles: one corral.multinode.Instance per worker."""
    hosts: dict[int, int] = field(default_factory=dict)
    """Grouped colocation: worker index -> the target worker that forked it (else the same
    index)."""


class RoleTable:
    """Which roles exist, their workers, and who owns a worker's process."""

    def __init__(self) -> None:
        self.roles: dict[str, RoleState] = {}
        self.ids: dict[str, Worker] = {}
        self.unrestartable: dict[str, str] = {}
        """worker id -> why its restart failed (later calls raise that)."""

    def __contains__(self, role: object) -> bool:
        return role in self.roles

    def names(self) -> list[str]:
        return list(self.roles)

    def known(self) -> str:
        return ", ".join(self.roles) or "none"

    def state(self, role: str) -> RoleState:
        state = self.roles.get(role)
        if state is None:
            raise WorkerNotFoundError(role, f"no role {role!r} (roles: {self.known()})")
        return state

    def watched(self) -> dict[str, list[str]]:
        """Role -> worker ids of the roles with processes of their own (health monitor)."""
        return {
            role: [w.id for w in state.workers]
            for role, state in list(self.roles.items())
            if state.kind != REUSED
        }

    def worker(self, worker_id: str) -> Worker:
        why = self.unrestartable.get(worker_id)
        if why is not None:
            raise WorkerFailedError(worker_id, reason=f"died and could not be restarted: {why}")
        worker = self.ids.get(worker_id)
        if worker is None:
            raise WorkerNotFoundError(
                worker_id, f"no worker {worker_id!r}; known roles: {self.known()}"
            )
        return worker

    def add_workers(self, workers: list[Worker]) -> None:
        for w in workers:
            self.ids[w.id] = w

    def owner(self, state: RoleState) -> RoleState:
        """The role whose launched processes a reused role's workers are."""
        return self.roles.get(state.target, state) if state.kind == REUSED else state

    def process_role(self, worker: Worker) -> str:
        """The role the backend launched ``worker``'s process (or its host's) under."""
        state = self.roles.get(worker.role)
        if state is not None and state.kind != LAUNCHED and state.target:
            return state.target
        return worker.role

    def check_new(
        self, job: NormalizedJob, n_gpus_per_node: int, launcher: Launcher, backend: str
    ) -> None:
        """Raise ConfigError (field, value, fix) if ``job`` cannot become a role here."""
        if job.role in self.roles:
            raise JobConfigError(
                "job.role",
                job.role,
                "Worker group already exists: this role already exists; delete_workers(role) "
                "first or use another name",
                job.role,
            )
        if job.is_colocated:
            target = job.strategy.target
            if target not in self.roles:
                raise UnknownRoleError(
                    "scheduling_strategy.target",
                    target,
                    f"create that role first (roles: {self.known()})",
                    job.role,
                )
            target_job = self.roles[target].job
            if is_grouped(job, target_job.replicas):  # or a refusal with the arithmetic
                check_grouped(job, target_job)
            return
        check_resources(job, n_gpus_per_node, launcher, backend)


def check_resources(
    job: NormalizedJob, n_gpus_per_node: int, launcher: Launcher, backend: str
) -> None:
    """The checks of a role that gets processes of its own (also used by dry runs)."""
    check_multinode(job, n_gpus_per_node, backend, launcher.multi_node)
    if any(spec.max_restarts for spec in job.tasks) and not can_restart(launcher):
        raise ConfigError(
            "SchedulingSpec.max_restarts",
            max(spec.max_restarts for spec in job.tasks),
            f"the {backend} backend cannot restart workers; use 0 (fail fast)",
        )
    launcher.check(job)
