"""Slurm preemption (opt-in: ``requeue=True``): whether a role's job was requeued since
its workers last started, read from Slurm's own words in the batch log (the launcher's
``preemption`` part, :class:`SlurmPreemption`)."""

from __future__ import annotations

from corral.backends.slurm.job_files import requeue_count, sbatch_log_path
from corral.backends.slurm.jobs import RoleJob, RoleJobs
from corral.capabilities import Preemptible


def requeue_reason(role: str, job: RoleJob) -> str | None:
    """Why the job's workers are gone if Slurm requeued (preempted) it since the workers
    last started, else None. Slurm's own words, from the batch log."""
    count = requeue_count(sbatch_log_path(job.log_dir, role), job.job_id)
    if count <= job.requeues_seen:
        return None
    return (
        f"Slurm job {job.job_id} was preempted and requeued; its workers come back "
        "when Slurm starts it again (Scheduler.wait_role waits for them)"
    )


class SlurmPreemption(Preemptible):
    """Was a role's job requeued since its workers last started (``requeue`` on)?"""

    def __init__(self, jobs: RoleJobs, *, requeue: bool) -> None:
        self.jobs = jobs
        self.requeue = requeue

    def preempted(self, role: str) -> bool:
        return self.requeue and any(
            requeue_count(sbatch_log_path(j.log_dir, role), j.job_id) > j.requeues_seen
            for j in self.jobs.of(role)
        )

    def mark_returned(self, role: str) -> None:
        """The role's workers are back after a requeue: later requeues count anew."""
        for job in self.jobs.of(role):
            job.requeues_seen = requeue_count(sbatch_log_path(job.log_dir, role), job.job_id)
