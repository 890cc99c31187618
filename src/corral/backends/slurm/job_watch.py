"""Watching a role's Slurm jobs: which replicas died (their exit files, else the job's
state), why the role still waits, and a queue reason that can never clear
(:class:`JobWatch`, the launcher's ``poll``, ``pending_reason`` and ``hopeless``)."""

from __future__ import annotations

import os

from corral.backends.slurm.commands import run_command
from corral.backends.slurm.inventory import ClusterFacts
from corral.backends.slurm.job_files import (
    describe_exit_code,
    ending_state_from_log,
    exit_code_path,
    read_exit_file,
    sbatch_log_path,
)
from corral.backends.slurm.jobs import RoleJob, RoleJobs
from corral.backends.slurm.members import member_exits
from corral.backends.slurm.queue import (
    ACTIVE,
    ENDED,
    PENDING,
    JobState,
    SlurmQueue,
    classify_state,
    describe_state,
    normalize_state,
)
from corral.backends.slurm.requeues import requeue_reason
from corral.backends.slurm.restart_step import step_failure
from corral.launcher import WorkerExit
from corral.multinode import nodes_of
from corral.paths import replica_log_path


class JobWatch:
    """Which replicas of a role died and why, from the jobs in ``jobs``, the exit files
    their tasks write and the job states ``queue`` reads; ``cluster`` names queue reasons
    that never clear."""

    def __init__(
        self,
        jobs: RoleJobs,
        queue: SlurmQueue,
        cluster: ClusterFacts,
        *,
        requeue: bool,
        n_gpus_per_node: int,
    ) -> None:
        self.jobs = jobs
        self.queue = queue
        self.cluster = cluster
        self.requeue = requeue
        self.n_gpus_per_node = n_gpus_per_node

    def states(self) -> dict[str, JobState]:
        """What Slurm says of every job that still runs a replica (one squeue for all)."""
        ids = self.jobs.live_ids()
        return self.queue.states(ids) if ids else {}

    def _live_jobs(self, role: str) -> tuple[list[RoleJob], dict[str, JobState]]:
        """The role's jobs that still hold replicas, and what Slurm says of them."""
        jobs = self.jobs.live(role)
        return jobs, (self.states() if jobs else {})

    def poll(self, role: str) -> dict[int, WorkerExit]:
        with self.jobs.lock:
            jobs = [(j, list(j.indices)) for j in self.jobs.by_role.get(role, ())]
        dead: dict[int, WorkerExit] = {}
        states: dict[str, JobState] | None = None
        for job, indices in jobs:
            if not indices:
                continue
            mine: dict[int, WorkerExit] = {}
            for index in indices:
                code = read_exit_file(exit_code_path(job.log_dir, role, index, job.job_id))
                if code is not None:
                    mine[index] = WorkerExit(
                        describe_exit_code(code), code, replica_log_path(job.log_dir, role, index)
                    )
            k = self._nodes_per_worker(role)
            if k > 1:  # a dead member is its instance's death, named by its node
                mine.update(member_exits(job.log_dir, role, indices, job.job_id, k))
            if mine and not set(mine) <= job.exits_seen:
                job.exits_seen.update(mine)
                self.queue.invalidate()  # a new exit file: what Slurm says of the job now
                states = None
            if mine:
                if states is None:
                    states = self.states()
                ended = slurm_ending(job, role, states.get(job.job_id))
                if ended:  # the code its stop returned stays in the error (exit code N)
                    for index, exit_ in mine.items():
                        mine[index] = WorkerExit(ended, exit_.exit_code, exit_.log_path)
            if len(mine) < len(indices):
                if states is None:
                    states = self.states()
                self._job_ended(role, job, indices, states, mine)
            if mine and self.requeue:
                why = requeue_reason(role, job)
                if why:
                    for index in indices:
                        path = replica_log_path(job.log_dir, role, index)
                        mine[index] = WorkerExit(why, None, path, preempted=True)
            dead.update(mine)
        for (step_role, index), proc in list(self.jobs.steps.items()):
            if step_role != role or index in dead:
                continue
            why = step_failure(proc)
            if why is not None:
                job = next((j for j, _ in jobs if index in j.indices), None)
                if job is None or not os.path.exists(
                    exit_code_path(job.log_dir, role, index, job.job_id)
                ):
                    path = replica_log_path(job.log_dir, role, index) if job else None
                    dead[index] = WorkerExit(why, proc.returncode, path)
        return dead

    def _nodes_per_worker(self, role: str) -> int:
        job = self.jobs.spec(role)
        return nodes_of(job.tasks[0], self.n_gpus_per_node) if job else 1

    def _job_ended(
        self,
        role: str,
        job: RoleJob,
        indices: list[int],
        states: dict[str, JobState],
        dead: dict[int, WorkerExit],
    ) -> None:
        """Add to ``dead`` the replicas of ``job`` that died with the whole job."""
        state = states.get(job.job_id) or JobState("UNKNOWN")
        kind = classify_state(state.state)
        if kind == ACTIVE:
            job.seen_active = True
        if not (kind == ENDED or (kind == PENDING and job.seen_active)):
            return
        if kind == PENDING and self.requeue:
            job.seen_active = False  # requeued: it will run again
            reason = (
                f"Slurm job {job.job_id} was preempted and requeued ({state.reason or '?'}); "
                "its workers come back when Slurm starts it again (Scheduler.wait_role)"
            )
            for index in indices:
                path = replica_log_path(job.log_dir, role, index)
                dead.setdefault(index, WorkerExit(reason, None, path, preempted=True))
            return
        name = state.state
        if state.completing:
            from corral.logs import tail

            name = (
                ending_state_from_log(tail(sbatch_log_path(job.log_dir, role), 50), job.job_id)
                or "COMPLETING"
            )
        reason = describe_state(job.job_id, name)
        if kind == PENDING:
            reason += " after its workers had started"
        for index in indices:
            if index not in dead:
                path = replica_log_path(job.log_dir, role, index)
                if not os.path.exists(path):
                    path = sbatch_log_path(job.log_dir, role)
                dead[index] = WorkerExit(reason, state.exit_code, path)

    def pending_reason(self, role: str) -> str | None:
        jobs, states = self._live_jobs(role)
        if not jobs:
            return None
        for job in jobs:  # a queued job first: that is what the role waits for
            state = states.get(job.job_id) or JobState("UNKNOWN")
            if normalize_state(state.state) == "PENDING":
                return f"Slurm job {job.job_id}: PENDING ({state.reason})"
        job = jobs[-1]
        state = states.get(job.job_id) or JobState("UNKNOWN")
        name = normalize_state(state.state)
        if name == "RUNNING":
            return (
                f"Slurm job {job.job_id}: RUNNING on {state.nodes or '?'} but not every worker "
                f"registered (see {sbatch_log_path(job.log_dir, role)})"
            )
        return describe_state(job.job_id, state.state, state.reason)

    def hopeless(self, role: str) -> str | None:
        """A queue reason that can never clear: the job is cancelled and this says why."""
        jobs, states = self._live_jobs(role)
        if not jobs:
            return None
        for job in jobs:
            state = states.get(job.job_id)
            if state is None or normalize_state(state.state) != "PENDING":
                continue
            why = self.cluster.never_clears(state.reason)
            if why:
                run_command(["scancel", job.job_id])
                return f"Slurm job {job.job_id} is PENDING ({why}); it was cancelled"
        return None


#: job states that say Slurm itself ended the job (not its tasks, by exiting)
SLURM_ENDINGS = frozenset(
    ("CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "DEADLINE", "BOOT_FAIL", "OUT_OF_MEMORY")
)


def slurm_ending(job: RoleJob, role: str, state: JobState | None) -> str | None:
    """``"Slurm job 12 CANCELLED"`` (TIMEOUT, NODE_FAIL, ...) if Slurm itself is ending or
    ended ``job``, else None.

    A worker's exit file holds the code its own stop returned, and that depends on the
    cluster (which processes its process tracking signals, how long KillWait lets them
    drain): 143 on one, 1 on another. It is not why the worker went. Slurm marks the job
    (COMPLETING, and slurmstepd's ``*** JOB ... CANCELLED AT`` line in the batch log)
    before it signals the tasks, so a look at the job once the exit file is there names
    the cause on any cluster."""
    if state is None:
        return None
    name = normalize_state(state.state)
    if state.completing or name == "COMPLETING":
        from corral.logs import tail

        name = ending_state_from_log(tail(sbatch_log_path(job.log_dir, role), 50), job.job_id)
    if name not in SLURM_ENDINGS:
        return None
    return describe_state(job.job_id, name)
