"""SlurmLauncher: one ``sbatch`` job per role, one ``srun`` task per worker.

The launcher composes its parts, each a small object that receives the shared state
(:class:`~corral.backends.slurm.jobs.RoleJobs`) and what else it needs:

- :class:`~corral.backends.slurm.submit.JobSubmitter`: render, check and submit a script;
- :class:`~corral.backends.slurm.job_watch.JobWatch`: ``poll``, ``pending_reason``, ``hopeless``;
- :class:`~corral.backends.slurm.job_stop.JobStopper`: ``stop`` and ``close``;
- :class:`~corral.backends.slurm.replica_restart.ReplicaRestarts`: ``restart``;
- the capability parts (corral.capabilities): ``elastic``
  (:class:`~corral.backends.slurm.elastic_jobs.SlurmElastic`), ``preemption``
  (:class:`~corral.backends.slurm.requeues.SlurmPreemption`) and ``adoption``
  (:class:`~corral.backends.slurm.adoption.SlurmAdoption`).

Whether one worker has died is read from the exit file its task writes; whether the
whole job has ended (cancelled from outside, timed out, node failure, ...) from Slurm's
job state. Restart policy (``SchedulingSpec.max_restarts > 0``): the role's step runs
without ``--kill-on-bad-exit`` so that one dead replica leaves the others running, and
the replica comes back inside its job or as a one-task job of its own; a role then has
several jobs, and polling and stopping cover all of them.
"""

from __future__ import annotations

import logging
import os
import sys

from corral.backends.backend_options import SlurmOptions
from corral.backends.slurm.adoption import SlurmAdoption
from corral.backends.slurm.commands import require_command, run_command
from corral.backends.slurm.elastic_jobs import SlurmElastic
from corral.backends.slurm.inventory import ClusterFacts
from corral.backends.slurm.job_files import JobFiles, forget_exits
from corral.backends.slurm.job_stop import JobStopper
from corral.backends.slurm.job_watch import JobWatch
from corral.backends.slurm.jobs import RoleJob, RoleJobs
from corral.backends.slurm.leftover_jobs import cancel_trial_jobs
from corral.backends.slurm.queue import SlurmQueue
from corral.backends.slurm.replica_restart import ReplicaRestarts
from corral.backends.slurm.requeues import SlurmPreemption
from corral.backends.slurm.submit import JobSubmitter
from corral.launcher import Launcher, LaunchRequest, WorkerExit
from corral.safedirs import make_private_subdir, write_private
from corral.spec import NormalizedJob

log = logging.getLogger("corral")


class SlurmLauncher(Launcher):
    """One ``sbatch`` job per role; the work is its parts' (see the module)."""

    name = "slurm"
    multi_node = True

    def __init__(
        self,
        *,
        n_gpus_per_node: int,
        options: SlurmOptions | None = None,
        python: str = sys.executable,
        dry_run: bool = False,
        requeue: bool = False,
        signal: str | None = None,
    ):
        self.n_gpus_per_node = n_gpus_per_node
        self.dry_run = dry_run
        self.queue = SlurmQueue()
        self.jobs = RoleJobs()
        self.cluster = ClusterFacts(run_command)
        self.submitter = JobSubmitter(
            n_gpus_per_node=n_gpus_per_node,
            options=(options or SlurmOptions()).checked(),
            python=python,
            dry_run=dry_run,
            requeue=requeue,
            signal=signal,
            queue=self.queue,
            cluster=self.cluster,
        )
        self.watch = JobWatch(
            self.jobs, self.queue, self.cluster, requeue=requeue, n_gpus_per_node=n_gpus_per_node
        )
        self.stopper = JobStopper(self.jobs)
        self.restarts = ReplicaRestarts(self.jobs, self.submitter, self.watch)
        self.elastic = SlurmElastic(self.jobs, self.submitter)
        self.preemption = SlurmPreemption(self.jobs, requeue=requeue)
        self.adoption = SlurmAdoption(self.jobs)
        if not dry_run:
            for command in ("sbatch", "squeue", "scontrol", "scancel"):
                require_command(command)

    # ------------------------------------------------------------- scripts
    def render(self, job: NormalizedJob, env: dict[str, str], log_dir: str) -> str:
        return self.submitter.render(job, env, log_dir)

    def describe(self, request: LaunchRequest) -> str:
        """The exact batch script ``launch(request)`` submits."""
        return self.render(request.job, request.envs[0], request.log_dir)

    # -------------------------------------------------------------- launch
    def check(self, job: NormalizedJob) -> None:
        self.submitter.check(job)

    def launch(self, request: LaunchRequest) -> None:
        job = request.job
        log_dir = request.log_dir
        script = self.render(job, request.envs[0], log_dir)
        make_private_subdir(os.path.join(log_dir, job.role))
        for index in range(job.replicas):  # a role made again must not read old exits
            forget_exits(log_dir, job.role, index)
        path = JobFiles(log_dir).batch_script(job.role)
        write_private(path, script)  # it holds env_vars (tokens): owner only
        job_id = self.submitter.submit(path, job, job.role)
        with self.jobs.lock:
            self.jobs.by_role[job.role] = [
                RoleJob(job_id, list(range(job.replicas)), log_dir, path)
            ]
            self.jobs.specs[job.role] = job
        log.info("submitted %s as Slurm job %s", job.role, job_id)

    # ------------------------------------------------------- the parts' work
    def poll(self, role: str) -> dict[int, WorkerExit]:
        return self.watch.poll(role)

    def pending_reason(self, role: str) -> str | None:
        return self.watch.pending_reason(role)

    def hopeless(self, role: str) -> str | None:
        return self.watch.hopeless(role)

    def restart(self, role: str, index: int, env: dict[str, str]) -> None:
        self.restarts.restart(role, index, env)

    def stop(self, role: str, reverse: bool = False) -> None:
        """The role's jobs are cancelled at once (one job holds every rank: no order)."""
        self.stopper.stop(role)

    def close(self) -> None:
        self.stopper.close()

    def remove_leftovers(self, experiment: str, trial: str) -> list[str]:
        return [f"Slurm job {job_id}: cancelled" for job_id in cancel_trial_jobs(experiment, trial)]

    # ------------------------------------------------------------ its jobs
    def job_id(self, role: str) -> str | None:
        """The role's first job (restarted replicas run in jobs of their own)."""
        ids = self.jobs.ids(role)
        return ids[0] if ids else None

    def job_ids(self, role: str) -> list[str]:
        """Every job of the role: the first, then one per restart."""
        return self.jobs.ids(role)

    def first_job_ids(self) -> dict[str, str]:
        """Role -> its first job id."""
        return self.jobs.first_ids()
