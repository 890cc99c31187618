"""Dry runs: what a role's launch would ask the backend for, as text, starting nothing.

``Scheduler.dry_run(job)`` runs the checks ``create_workers`` runs and hands the same
``LaunchRequest`` to the backend's ``Launcher.describe``. A scheduler made with
``dry_run=True`` (``corral.config.make_scheduler(cfg, dry_run=True)``, which
``corral run --dry-run`` uses for every backend) creates no directory, writes no secret
and opens no name-resolve store; its ``create_workers`` prints the plan.
"""

from __future__ import annotations

from typing import Any

from corral.controller.launch import worker_env
from corral.controller.parts import ControllerParts
from corral.controller.role_table import check_resources
from corral.launcher import LaunchRequest
from corral.spec import Job, NormalizedJob, SchedulingSpec


def plan(c: ControllerParts, job: NormalizedJob) -> str:
    """The printable launch request of ``job`` on the controller's backend."""
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
            f"# dry run ({c.backend}): {job.role} is colocated, {how} "
            f"{job.strategy.target}; it has no launch of its own{grouped}"
        )
    check_resources(job, c.n_gpus_per_node, c.launcher, c.backend)
    envs = [worker_env(c, job.role, i, spec) for i, spec in enumerate(job.tasks)]
    request = LaunchRequest(job=job, envs=envs, log_dir=c.paths.log_dir)
    return c.launcher.describe(request)


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
