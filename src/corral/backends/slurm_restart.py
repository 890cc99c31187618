"""Restarting one Slurm replica: as a step of its own job on its old node and GPUs while
the job runs, else as a one-task job of its own."""

from __future__ import annotations

import dataclasses
import logging

from corral.backends.sbatch import render_sbatch_script, render_task_script
from corral.backends.slurm_queue import RoleJob, normalize_state
from corral.backends.slurm_steps import read_place, start_step
from corral.errors import SchedulerError
from corral.paths import TrialPaths
from corral.safedirs import write_private
from corral.spec import NormalizedJob

log = logging.getLogger("corral")


class SlurmRestarts:
    """Mixin of SlurmLauncher: ``restart``."""

    def restart(self, role: str, index: int, env: dict[str, str]) -> None:
        """Submit a one-task job for replica ``index`` (same spec, same log files, appended;
        ``CORRAL_INDEX_OFFSET=index``). The replica's old job keeps its other replicas:
        a role with ``max_restarts > 0`` runs its step without ``--kill-on-bad-exit``."""
        with self._lock:
            jobs = list(self._jobs.get(role, ()))
            nj = self._specs.get(role)
        owner = next((j for j in jobs if index in j.indices), None)
        if nj is None or owner is None or not 0 <= index < nj.replicas:
            raise SchedulerError(f"cannot restart {role}/{index}: no Slurm job runs it")
        log_dir = owner.log_dir
        if self._restart_in_allocation(role, index, env, owner, nj):
            return
        one = NormalizedJob(role, 1, (nj.tasks[index],), nj.strategy)
        params = dataclasses.replace(self.params(one, env, log_dir), index_offset=index)
        script = render_sbatch_script(params)
        path = TrialPaths.at(log_dir).restart_script(role, index, len(jobs))
        write_private(path, script)
        # the dead replica's exit file must not make the new one look dead
        self._forget_exit(log_dir, role, index)
        job_id = self._submit(path, one, f"{role}/{index} restart")
        with self._lock:
            if index in owner.indices:
                owner.indices.remove(index)
            self._jobs.setdefault(role, []).append(RoleJob(job_id, [index], log_dir, path))
        log.info("restarting %s/%s as Slurm job %s", role, index, job_id)

    def _restart_in_allocation(
        self, role: str, index: int, env: dict[str, str], owner: RoleJob, nj: NormalizedJob
    ) -> bool:
        """Start the replica again as a step of its own job on its node and GPUs (see
        corral.backends.slurm_steps); False if the job no longer runs."""
        place = read_place(owner.log_dir, role, index)
        self.queue.invalidate()
        state = self._states().get(owner.job_id)
        if place is None or state is None or normalize_state(state.state) != "RUNNING":
            return False
        old = self._steps.pop((role, index), None)
        if old is not None and old.poll() is None:
            old.kill()
            old.wait()
        self._forget_exit(owner.log_dir, role, index, owner.job_id)
        task = render_task_script(self.params(nj, env, owner.log_dir))
        self._steps[(role, index)] = start_step(
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
