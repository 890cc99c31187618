"""Slurm preemption (opt-in: ``requeue=True``): whether a role's job was requeued since
its workers last started, read from Slurm's own words in the batch log."""

from __future__ import annotations

from corral.backends.slurm_queue import RoleJob, requeue_count
from corral.paths import sbatch_log_path


class SlurmPreemption:
    """Mixin of SlurmLauncher: the Preemptible capability's questions."""

    def _preemption(self, role: str, job: RoleJob) -> str | None:
        """Why the job's workers are gone if Slurm requeued (preempted) it since the
        workers last started, else None. Slurm's own words, from the batch log."""
        count = requeue_count(sbatch_log_path(job.log_dir, role), job.job_id)
        if count <= job.requeues_seen:
            return None
        return (
            f"Slurm job {job.job_id} was preempted and requeued; its workers come back "
            "when Slurm starts it again (Scheduler.wait_role waits for them)"
        )

    def preempted(self, role: str) -> bool:
        with self._lock:
            jobs = list(self._jobs.get(role, ()))
        return self.requeue and any(
            requeue_count(sbatch_log_path(j.log_dir, role), j.job_id) > j.requeues_seen
            for j in jobs
        )

    def mark_returned(self, role: str) -> None:
        """The role's workers are back after a requeue: later requeues count anew."""
        with self._lock:
            jobs = list(self._jobs.get(role, ()))
        for job in jobs:
            job.requeues_seen = requeue_count(sbatch_log_path(job.log_dir, role), job.job_id)
