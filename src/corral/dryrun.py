"""Dry runs: what a role's launch would ask the backend for, as text, starting nothing.

``Scheduler.dry_run(job)`` runs the checks ``create_workers`` runs and hands the same
``LaunchRequest`` to the backend's ``Launcher.describe``. :func:`from_config` serves
``corral run --dry-run`` for every backend in the registry. A scheduler made with
``dry_run=True`` creates no directory, writes no secret and opens no name-resolve store
(see ``Scheduler.__init__``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from corral.launcher import LaunchRequest
from corral.roles import check_resources
from corral.spec import Job, NormalizedJob, SchedulingSpec

if TYPE_CHECKING:
    from corral.scheduler import Scheduler


def plan(sched: Scheduler, job: NormalizedJob) -> str:
    """The printable launch request of ``job`` on ``sched``'s backend."""
    if job.is_colocated:
        how = "forked next to" if job.strategy.fork else "reusing the workers of"
        gpu = job.tasks[0].gpu
        grouped = (
            f"\n# if {job.strategy.target} has other than {job.replicas} workers, grouped "
            f"colocation (docs/shapes.md): its GPUs on each node cut into groups of {gpu}, "
            f"one {job.role} worker per group seeing exactly those devices; needs "
            f"{job.replicas} x {gpu} = {job.replicas * gpu} = {job.strategy.target}'s GPUs"
            if job.strategy.fork and gpu
            else ""
        )
        return (
            f"# dry run ({sched.backend}): {job.role} is colocated, {how} "
            f"{job.strategy.target}; it has no launch of its own{grouped}"
        )
    check_resources(job, sched.n_gpus_per_node, sched.launcher, sched.backend)
    envs = [sched.worker_env(job.role, i, spec) for i, spec in enumerate(job.tasks)]
    request = LaunchRequest(job=job, envs=envs, log_dir=sched.paths.log_dir)
    return sched.launcher.describe(request)


def job_of(cfg: Any, role: str, replicas: int) -> Job:
    """A job of ``replicas`` workers of ``role``; the spec is ``cfg.scheduling_spec`` if
    the config has one (one spec or a list), else the default ``SchedulingSpec()``."""
    spec = getattr(cfg, "scheduling_spec", None)
    if isinstance(spec, (list, tuple)):
        tasks = list(spec)
    elif isinstance(spec, SchedulingSpec):
        tasks = [spec]
    else:
        tasks = [SchedulingSpec()]
    return Job(role=role, replicas=replicas, tasks=tasks)


def from_config(cfg: Any, role: str, replicas: int) -> str:
    """``corral run --dry-run``: the launch request on the backend ``cfg.scheduler.type``
    names (local, ray or slurm), starting and writing nothing."""
    from corral.backends import scheduler_class
    from corral.config import scheduler_field

    cls = scheduler_class(scheduler_field(cfg, "type"))
    sched = cls(exp_config=cfg, dry_run=True)
    try:
        return sched.dry_run(job_of(cfg, role, replicas))
    finally:
        sched.close()
