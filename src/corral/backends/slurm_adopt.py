"""A dead controller's Slurm run: adopting its jobs (``attach=True``), or cancelling
what it left."""

from __future__ import annotations

from corral.backends.slurm_queue import RoleJob, _run, requeue_count
from corral.errors import SchedulerError
from corral.paths import TrialPaths, sbatch_log_path
from corral.safedirs import user_name
from corral.spec import NormalizedJob, SchedulingSpec, SchedulingStrategy


def cancel_trial_jobs(experiment: str, trial: str) -> list[str]:
    """scancel every queued or running job of a trial (jobs are named exp:trial:role) that
    belongs to this user: ``-u`` keeps an admin from cancelling other users' jobs."""
    r = _run(["squeue", "-h", "-u", user_name(), "-o", "%i|%j"])
    prefix = f"{experiment}:{trial}:"
    ids = [
        line.split("|", 1)[0]
        for line in r.stdout.splitlines()
        if "|" in line and line.split("|", 1)[1].startswith(prefix)
    ]
    if ids:
        _run(["scancel", *ids])
    return ids


class SlurmAdoption:
    """Mixin of SlurmLauncher: ``adopt`` (the Adoptable capability) and
    ``remove_leftovers``."""

    def adopt(self, role: str, workers: list, log_dir: str) -> None:
        """The jobs of a dead controller's run, by the job id each worker registered."""
        by_job: dict[str, list[int]] = {}
        for worker in workers:
            if not worker.backend_id:
                raise SchedulerError(f"cannot adopt {worker.id}: it registered no Slurm job id")
            by_job.setdefault(str(worker.backend_id), []).append(worker.index)
        script = TrialPaths.at(log_dir).sbatch_script(role)
        with self._lock:
            self._jobs[role] = [
                RoleJob(
                    job_id, indices, log_dir, script, seen_active=True,
                    requeues_seen=requeue_count(sbatch_log_path(log_dir, role), job_id),
                )
                for job_id, indices in by_job.items()
            ]  # fmt: skip
            self._specs[role] = NormalizedJob(
                role, len(workers), tuple(SchedulingSpec() for _ in workers), SchedulingStrategy()
            )

    def remove_leftovers(self, experiment: str, trial: str) -> list[str]:
        return [f"Slurm job {job_id}: cancelled" for job_id in cancel_trial_jobs(experiment, trial)]
