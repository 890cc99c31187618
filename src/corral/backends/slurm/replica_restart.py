"""Restarting one Slurm replica: as a step of its own job on its old node and GPUs while
the job runs, else as a one-task job of its own (the launcher's ``restart``,
:class:`ReplicaRestarts`)."""

from __future__ import annotations

import dataclasses
import logging

from corral.backends.slurm.batch_script import render_sbatch_script, render_task_script
from corral.backends.slurm.job_files import JobFiles, forget_exits
from corral.backends.slurm.job_watch import JobWatch
from corral.backends.slurm.jobs import RoleJob, RoleJobs
from corral.backends.slurm.queue import normalize_state
from corral.backends.slurm.restart_step import read_place, start_step
from corral.backends.slurm.submit import JobSubmitter
from corral.errors import SchedulerError
from corral.safedirs import write_private
from corral.spec import NormalizedJob

log = logging.getLogger("corral")


class ReplicaRestarts:
    """A dead replica again: inside its job (``srun --overlap``) while the job runs,
    else a one-task job submitted with ``submitter``; ``watch`` says whether it runs."""

    def __init__(self, jobs: RoleJobs, submitter: JobSubmitter, watch: JobWatch) -> None:
        self.jobs = jobs
        self.submitter = submitter
        self.watch = watch

    def restart(self, role: str, index: int, env: dict[str, str]) -> None:
        """Submit a one-task job for replica ``index`` (same spec, same log files, appended;
        ``CORRAL_INDEX_OFFSET=index``). The replica's old job keeps its other replicas:
        a role with ``max_restarts > 0`` runs its step without ``--kill-on-bad-exit``."""
        jobs = self.jobs.of(role)
        nj = self.jobs.spec(role)
        owner = next((j for j in jobs if index in j.indices), None)
        if nj is None or owner is None or not 0 <= index < nj.replicas:
            raise SchedulerError(f"cannot restart {role}/{index}: no Slurm job runs it")
        log_dir = owner.log_dir
        if self._restart_in_allocation(role, index, env, owner, nj):
            return
        one = NormalizedJob(role, 1, (nj.tasks[index],), nj.strategy)
        params = dataclasses.replace(self.submitter.params(one, env, log_dir), index_offset=index)
        script = render_sbatch_script(params)
        path = JobFiles(log_dir).restart_script(role, index, len(jobs))
        write_private(path, script)
        # the dead replica's exit file must not make the new one look dead
        forget_exits(log_dir, role, index)
        job_id = self.submitter.submit(path, one, f"{role}/{index} restart")
        with self.jobs.lock:
            if index in owner.indices:
                owner.indices.remove(index)
            self.jobs.by_role.setdefault(role, []).append(RoleJob(job_id, [index], log_dir, path))
        log.info("restarting %s/%s as Slurm job %s", role, index, job_id)

    def _restart_in_allocation(
        self, role: str, index: int, env: dict[str, str], owner: RoleJob, nj: NormalizedJob
    ) -> bool:
        """Start the replica again as a step of its own job on its node and GPUs (see
        corral.backends.slurm.restart_step); False if the job no longer runs."""
        place = read_place(owner.log_dir, role, index)
        self.watch.queue.invalidate()
        state = self.watch.states().get(owner.job_id)
        if place is None or state is None or normalize_state(state.state) != "RUNNING":
            return False
        old = self.jobs.steps.pop((role, index), None)
        if old is not None and old.poll() is None:
            old.kill()
            old.wait()
        forget_exits(owner.log_dir, role, index, owner.job_id)
        task = render_task_script(self.submitter.params(nj, env, owner.log_dir))
        self.jobs.steps[(role, index)] = start_step(
            owner.job_id, place, nj.tasks[index].cpu, index, env, task
        )
        log.info(
            "restarting %s/%s inside Slurm job %s on %s (GPUs %s)",
            role,
            index,
            owner.job_id,
            place.node,
            place.devices or "none",
        )
        return True
