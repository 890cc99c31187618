"""Growing and shrinking a running role on Slurm (corral.controller.elastic): new replicas run in
a job of their own; a job left with no replica is ended."""

from __future__ import annotations

import dataclasses
import logging
import os

from corral.backends.sbatch import render_sbatch_script
from corral.backends.slurm_queue import (
    GRACEFUL_STOP_SECONDS,
    STOP_TIMEOUT_SECONDS,
    RoleJob,
    _run,
)
from corral.launcher import LaunchRequest
from corral.spec import NormalizedJob

log = logging.getLogger("corral")


class SlurmElastic:
    """Mixin of SlurmLauncher: ``grow`` and ``shrink`` (the Elastic capability)."""

    def grow(self, request: LaunchRequest, first: int) -> None:
        """New replicas ``first``.. run in a job of their own (``CORRAL_INDEX_OFFSET``)."""
        more, log_dir = request.job, request.log_dir
        role, tasks = more.role, more.tasks
        self.check(more)
        params = dataclasses.replace(
            self.params(more, request.envs[0], log_dir), index_offset=first
        )
        path = os.path.join(log_dir, f"{role}.grow{first}.sbatch")
        with open(path, "w") as fh:
            fh.write(render_sbatch_script(params))
        for index in range(first, first + len(tasks)):
            self._forget_exit(log_dir, role, index)
        job_id = self._submit(path, more, f"{role} grow")
        with self._lock:
            self._jobs[role].append(
                RoleJob(job_id, list(range(first, first + len(tasks))), log_dir, path)
            )
            nj = self._specs[role]
            self._specs[role] = NormalizedJob(
                role, nj.replicas + len(tasks), nj.tasks + tuple(tasks), nj.strategy
            )
        log.info("growing %s by %d as Slurm job %s", role, len(tasks), job_id)

    def shrink(self, role: str, indices: list[int]) -> None:
        """Forget the replicas (they were asked to exit); a job left with none is ended."""
        gone = set(indices)
        with self._lock:
            jobs = self._jobs.get(role, [])
            emptied = [j for j in jobs if j.indices and set(j.indices) <= gone]
            for job in jobs:
                job.indices = [i for i in job.indices if i not in gone]
            self._jobs[role] = [j for j in jobs if j not in emptied]
            nj = self._specs[role]
            keep = nj.replicas - len(gone)
            self._specs[role] = NormalizedJob(role, keep, nj.tasks[:keep], nj.strategy)
        for index in gone:
            proc = self._steps.pop((role, index), None)
            if proc is not None and proc.poll() is None:
                proc.terminate()
        for job in emptied:
            if not self.wait_gone(job.job_id, GRACEFUL_STOP_SECONDS, warn=False):
                _run(["scancel", job.job_id])
                self.wait_gone(job.job_id, STOP_TIMEOUT_SECONDS)
