"""Adopting a dead controller's Slurm jobs (``attach=True``): the launcher's ``adoption``
part, :class:`SlurmAdoption`."""

from __future__ import annotations

from corral.backends.slurm.job_files import JobFiles, requeue_count, sbatch_log_path
from corral.backends.slurm.jobs import RoleJob, RoleJobs
from corral.capabilities import Adoptable
from corral.errors import SchedulerError
from corral.spec import NormalizedJob, SchedulingSpec, SchedulingStrategy


class SlurmAdoption(Adoptable):
    """The jobs of a dead controller's run, by the job id each worker registered."""

    def __init__(self, jobs: RoleJobs) -> None:
        self.jobs = jobs

    def adopt(self, role: str, workers: list, log_dir: str) -> None:
        by_job: dict[str, list[int]] = {}
        for worker in workers:
            if not worker.backend_id:
                raise SchedulerError(f"cannot adopt {worker.id}: it registered no Slurm job id")
            by_job.setdefault(str(worker.backend_id), []).append(worker.index)
        script = JobFiles(log_dir).batch_script(role)
        adopted = [
            RoleJob(
                job_id, indices, log_dir, script, seen_active=True,
                requeues_seen=requeue_count(sbatch_log_path(log_dir, role), job_id),
            )
            for job_id, indices in by_job.items()
        ]  # fmt: skip
        spec = NormalizedJob(
            role, len(workers), tuple(SchedulingSpec() for _ in workers), SchedulingStrategy()
        )
        with self.jobs.lock:
            self.jobs.by_role[role] = adopted
            self.jobs.specs[role] = spec
