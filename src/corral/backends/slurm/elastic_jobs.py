"""Growing and shrinking a running role on Slurm (corral.elastic): new replicas run in
a job of their own; a job left with no replica is ended (the launcher's ``elastic``
part, :class:`SlurmElastic`)."""

from __future__ import annotations

import dataclasses
import logging

from corral.backends.slurm.batch_script import render_sbatch_script
from corral.backends.slurm.commands import (
    GRACEFUL_STOP_SECONDS,
    STOP_TIMEOUT_SECONDS,
    run_command,
)
from corral.backends.slurm.job_files import JobFiles, forget_exits
from corral.backends.slurm.job_stop import wait_gone
from corral.backends.slurm.jobs import RoleJob, RoleJobs
from corral.backends.slurm.submit import JobSubmitter
from corral.capabilities import Elastic
from corral.launcher import LaunchRequest
from corral.safedirs import write_private
from corral.spec import NormalizedJob

log = logging.getLogger("corral")


class SlurmElastic(Elastic):
    """``grow`` submits the new replicas as a job of their own; ``shrink`` forgets
    replicas and ends the jobs left with none."""

    def __init__(self, jobs: RoleJobs, submitter: JobSubmitter) -> None:
        self.jobs = jobs
        self.submitter = submitter

    def grow(self, request: LaunchRequest, first: int) -> None:
        """New replicas ``first``.. run in a job of their own (``CORRAL_INDEX_OFFSET``)."""
        more, log_dir = request.job, request.log_dir
        role, tasks = more.role, more.tasks
        self.submitter.check(more)
        params = dataclasses.replace(
            self.submitter.params(more, request.envs[0], log_dir), index_offset=first
        )
        path = JobFiles(log_dir).grow_script(role, first)
        write_private(path, render_sbatch_script(params))  # it holds env_vars: owner only
        for index in range(first, first + len(tasks)):
            forget_exits(log_dir, role, index)
        job_id = self.submitter.submit(path, more, f"{role} grow")
        with self.jobs.lock:
            self.jobs.by_role[role].append(
                RoleJob(job_id, list(range(first, first + len(tasks))), log_dir, path)
            )
            nj = self.jobs.specs[role]
            self.jobs.specs[role] = NormalizedJob(
                role, nj.replicas + len(tasks), nj.tasks + tuple(tasks), nj.strategy
            )
        log.info("growing %s by %d as Slurm job %s", role, len(tasks), job_id)

    def shrink(self, role: str, indices: list[int]) -> None:
        """Forget the replicas (they were asked to exit); a job left with none is ended."""
        gone = set(indices)
        with self.jobs.lock:
            jobs = self.jobs.by_role.get(role, [])
            emptied = [j for j in jobs if j.indices and set(j.indices) <= gone]
            for job in jobs:
                job.indices = [i for i in job.indices if i not in gone]
            self.jobs.by_role[role] = [j for j in jobs if j not in emptied]
            nj = self.jobs.specs[role]
            keep = nj.replicas - len(gone)
            self.jobs.specs[role] = NormalizedJob(role, keep, nj.tasks[:keep], nj.strategy)
        for index in gone:
            proc = self.jobs.steps.pop((role, index), None)
            if proc is not None and proc.poll() is None:
                proc.terminate()
        for job in emptied:
            if not wait_gone(job.job_id, GRACEFUL_STOP_SECONDS, warn=False):
                run_command(["scancel", job.job_id])
                wait_gone(job.job_id, STOP_TIMEOUT_SECONDS)
