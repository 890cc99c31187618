"""SlurmScheduler: one ``sbatch`` job per role, one ``srun`` task per worker.

The batch script comes from :mod:`corral.backends.sbatch` (pure rendering). This module
submits it, watches the job with Slurm's own commands (``squeue``, ``scontrol show
job``), and cancels it (``scancel``). Whether one worker has died is read from the exit
file its task writes (``<log_dir>/<role>/<index>.exit``); whether the whole job has
ended (cancelled from outside, timed out, node failure, ...) from Slurm's job state.

Restart policy (``SchedulingSpec.max_restarts > 0``): the role's step runs without
``--kill-on-bad-exit`` so that one dead replica leaves the others running, and
:meth:`SlurmLauncher.restart` submits a one-task job for the dead replica
(``CORRAL_INDEX_OFFSET=index``, same log files). A role then has several jobs, each
running a set of its replicas; polling and stopping cover all of them.

Everything that happens once a worker is reachable (health, engines, calls, fork via
``POST /fork``, colocation, teardown order) is the shared :class:`~corral.scheduler.Scheduler`.

``dry_run=True``: ``create_workers`` prints the batch script it would submit and returns
``[]`` without submitting anything; :meth:`SlurmScheduler.render_script` returns the
script as text, and :func:`render_dry_run` serves ``corral run --dry-run``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shlex
import subprocess
import sys
import threading
import time
from typing import Any

from corral import options as opts
from corral.backends.options import SlurmOptions
from corral.backends.sbatch import (
    SbatchParams,
    check_container,
    check_homogeneous,
    plan_layout,
    render_sbatch_script,
    render_task_script,
)
from corral.backends.slurm_cluster import fit_problem, never_clears, read_inventory
from corral.backends.slurm_queue import (  # the state names stay importable from here
    ACTIVE,
    ENDED,
    GRACEFUL_STOP_SECONDS,
    PENDING,
    QUERY_TIMEOUT_SECONDS,
    STOP_TIMEOUT_SECONDS,
    UNKNOWN,
    JobState,
    RoleJob,
    SlurmQueue,
    _describe_code,
    _read_exit_file,
    _require,
    _run,
    _unreachable,
    classify_state,
    describe_state,
    ending_state_from_log,
    normalize_state,
    parse_exit_code,
    requeue_count,
    state_is_final,
)
from corral.backends.slurm_steps import read_place, start_step, step_failure
from corral.capabilities import Adoptable, Elastic, Preemptible
from corral.config import cluster_field
from corral.dryrun import job_of
from corral.errors import ConfigError, PlacementError, SchedulerError
from corral.launcher import Launcher, LaunchRequest, WorkerExit
from corral.paths import TrialPaths, check_dir, exit_code_path, replica_log_path, sbatch_log_path
from corral.safedirs import make_private_subdir, user_name, write_private
from corral.scheduler import Scheduler
from corral.spec import NormalizedJob, SchedulingSpec, SchedulingStrategy, normalize_job
from corral.worker import env as E

log = logging.getLogger("corral")


# ----------------------------------------------------------------- launcher --
class SlurmLauncher(Launcher, Elastic, Preemptible, Adoptable):
    name = "slurm"

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
        self.options = (options or SlurmOptions()).checked()
        self.n_gpus_per_node = n_gpus_per_node
        self.requeue = requeue
        self.signal = signal
        self.python = python
        self.dry_run = dry_run
        self.queue = SlurmQueue()
        self._jobs: dict[str, list[RoleJob]] = {}
        """Role -> its jobs: the first one, then one per restarted replica."""
        self._specs: dict[str, NormalizedJob] = {}
        self._inventory: dict | None = None
        self._steps: dict[tuple[str, int], subprocess.Popen] = {}
        """Replicas restarted as steps inside their job: the ``srun --overlap`` clients."""
        self._lock = threading.Lock()
        if not dry_run:
            for command in ("sbatch", "squeue", "scontrol", "scancel"):
                _require(command)

    # ------------------------------------------------------------- scripts
    def params(self, job: NormalizedJob, env: dict[str, str], log_dir: str) -> SbatchParams:
        """The sbatch parameters of a role; ``env`` is replica 0's worker environment."""
        spec = check_homogeneous(job.tasks)
        common = {k: v for k, v in env.items() if k not in (E.INDEX, E.SECRET)}
        # the spec's env_vars are rendered last by the renderer itself
        for key in spec.env_vars:
            common.pop(key, None)
        experiment, trial = common[E.EXPERIMENT], common[E.TRIAL]
        return SbatchParams(
            job_name=f"{experiment}:{trial}:{job.role}",
            role=job.role,
            replicas=job.replicas,
            spec=spec,
            n_gpus_per_node=self.n_gpus_per_node,
            log_dir=log_dir,
            experiment=experiment,
            trial=trial,
            name_resolve=common[E.NAME_RESOLVE],
            secret_file=common.get(E.SECRET_FILE, ""),
            python=self.python,
            env=common,
            lease_timeout=float(common.get(E.LEASE_TIMEOUT, E.DEFAULT_LEASE_TIMEOUT)),
            options=self.options,
            requeue=self.requeue,
            signal=self.signal,
        )

    def render(self, job: NormalizedJob, env: dict[str, str], log_dir: str) -> str:
        return render_sbatch_script(self.params(job, env, log_dir))

    def describe(self, request: LaunchRequest) -> str:
        """The exact batch script ``launch(request)`` submits."""
        return self.render(request.job, request.envs[0], request.log_dir)

    # -------------------------------------------------------------- launch
    def check(self, job: NormalizedJob) -> None:
        spec = check_homogeneous(job.tasks)
        check_container(spec)
        layout = plan_layout(job.replicas, spec, self.n_gpus_per_node)
        if self.dry_run:
            return
        if self._inventory is None:
            self._inventory = read_inventory(_run) or {}
        problem = fit_problem(
            self._inventory, self.options.partition, layout.nodes, layout.gpus_per_node
        )
        if problem is not None:
            name, value, why = problem
            raise PlacementError(
                f"{job.role}: {name}", value, f"{job.role} can never be placed: {why}"
            )

    def hopeless(self, role: str) -> str | None:
        """A queue reason that can never clear: the job is cancelled and this says why."""
        with self._lock:
            jobs = [j for j in self._jobs.get(role, ()) if j.indices]
        if not jobs:
            return None
        states = self._states()
        for job in jobs:
            state = states.get(job.job_id)
            if state is None or normalize_state(state.state) != "PENDING":
                continue
            why = never_clears(state.reason, self._inventory)
            if why:
                _run(["scancel", job.job_id])
                return f"Slurm job {job.job_id} is PENDING ({why}); it was cancelled"
        return None

    def _submit(self, path: str, job: NormalizedJob, what: str) -> str:
        """sbatch the script at ``path``; its job id, or PlacementError saying why not."""
        # the job inherits sbatch's umask: its logs and directories are private to the user
        r = _run(["sbatch", "--parsable", path], umask=0o077)
        job_id = r.stdout.strip().split(";")[0]
        if r.returncode != 0 or not job_id.isdigit():
            spec = job.tasks[0]
            layout = plan_layout(job.replicas, spec, self.n_gpus_per_node)
            message = (r.stderr or r.stdout).strip() or f"exit code {r.returncode}"
            raise PlacementError(
                f"{job.role}: sbatch",
                f"{job.replicas} worker(s)",
                f"Slurm refused the {what} job: {message}. Asked for {job.replicas} "
                f"worker(s) x (cpu={spec.cpu}, gpu={spec.gpu}, mem={spec.mem}G) on "
                f"{layout.nodes} node(s) ({layout.ntasks_per_node} per node"
                + (f", gres gpu:{layout.gpus_per_node}" if layout.gpus_per_node else "")
                + f"); check n_gpus_per_node and the partition's nodes (sinfo). Script: {path}",
            )
        self.queue.invalidate()
        return job_id

    @staticmethod
    def _forget_exit(log_dir: str, role: str, index: int, job_id: str | None = None) -> None:
        try:
            os.unlink(exit_code_path(log_dir, role, index, job_id))
        except FileNotFoundError:
            pass

    def launch(self, request: LaunchRequest) -> None:
        job = request.job
        log_dir = request.log_dir
        script = self.render(job, request.envs[0], log_dir)
        role_dir = os.path.join(log_dir, job.role)
        make_private_subdir(role_dir)
        for index in range(job.replicas):  # a role made again must not read old exits
            self._forget_exit(log_dir, job.role, index)
        path = TrialPaths.at(log_dir).sbatch_script(job.role)
        write_private(path, script)  # it holds env_vars (tokens): owner only
        job_id = self._submit(path, job, job.role)
        with self._lock:
            self._jobs[job.role] = [RoleJob(job_id, list(range(job.replicas)), log_dir, path)]
            self._specs[job.role] = job
        log.info("submitted %s as Slurm job %s", job.role, job_id)

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

    def grow(
        self, role: str, first: int, tasks: list, envs: list[dict[str, str]], log_dir: str
    ) -> None:
        """New replicas ``first``.. run in a job of their own (``CORRAL_INDEX_OFFSET``)."""
        with self._lock:
            nj = self._specs[role]
        more = NormalizedJob(role, len(tasks), tuple(tasks), nj.strategy)
        self.check(more)
        params = dataclasses.replace(self.params(more, envs[0], log_dir), index_offset=first)
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

    def job_id(self, role: str) -> str | None:
        """The role's first job (restarted replicas run in jobs of their own)."""
        jobs = self._jobs.get(role)
        return jobs[0].job_id if jobs else None

    def job_ids(self, role: str) -> list[str]:
        """Every job of the role: the first, then one per restart."""
        return [j.job_id for j in self._jobs.get(role, ())]

    # ---------------------------------------------------------------- poll
    def _states(self) -> dict[str, JobState]:
        with self._lock:
            ids = [j.job_id for jobs in self._jobs.values() for j in jobs if j.indices]
        return self.queue.states(ids) if ids else {}

    def poll(self, role: str) -> dict[int, WorkerExit]:
        with self._lock:
            jobs = [(j, list(j.indices)) for j in self._jobs.get(role, ())]
        dead: dict[int, WorkerExit] = {}
        states: dict[str, JobState] | None = None
        for job, indices in jobs:
            if not indices:
                continue
            mine: dict[int, WorkerExit] = {}
            for index in indices:
                code = _read_exit_file(exit_code_path(job.log_dir, role, index, job.job_id))
                if code is not None:
                    mine[index] = WorkerExit(
                        _describe_code(code), code, replica_log_path(job.log_dir, role, index)
                    )
            if len(mine) < len(indices):
                if states is None:
                    states = self._states()
                self._job_ended(role, job, indices, states, mine)
            if mine and self.requeue:
                why = self._preemption(role, job)
                if why:
                    for index in indices:
                        path = replica_log_path(job.log_dir, role, index)
                        mine[index] = WorkerExit(why, None, path, preempted=True)
            dead.update(mine)
        for (step_role, index), proc in list(self._steps.items()):
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
        with self._lock:
            jobs = [j for j in self._jobs.get(role, ()) if j.indices]
        if not jobs:
            return None
        states = self._states()
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

    # ---------------------------------------------------------------- stop
    def stop(self, role: str, reverse: bool = False) -> None:
        """The role's jobs are cancelled at once (one job holds every rank: no order)."""
        with self._lock:
            jobs = self._jobs.pop(role, [])
            self._specs.pop(role, None)
        if not jobs:
            return
        ids = [j.job_id for j in jobs]
        # The core has asked the workers to exit: a job whose tasks all ended completes by
        # itself, faster than scancel's SIGTERM -> KillWait -> SIGKILL; scancel follows.
        deadline = time.monotonic() + GRACEFUL_STOP_SECONDS
        for job_id in ids:
            self.wait_gone(job_id, max(0.0, deadline - time.monotonic()), warn=False)
        deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
        while True:  # through a slurmctld outage: retry until it answers
            try:
                r = _run(["scancel", *ids], timeout=QUERY_TIMEOUT_SECONDS)
            except SchedulerError as exc:
                r = subprocess.CompletedProcess([], 1, "", str(exc))
            if not (r.returncode != 0 and _unreachable(r.stderr)):
                break
            if time.monotonic() >= deadline:
                log.warning(
                    "slurmctld did not answer for %.0fs: Slurm jobs %s may still run; "
                    "scancel them when it is back",
                    STOP_TIMEOUT_SECONDS,
                    " ".join(ids),
                )
                return
            time.sleep(1.0)
        if r.returncode != 0 and "Invalid job id" not in r.stderr:
            log.warning("scancel %s: %s", " ".join(ids), r.stderr.strip())
        for job_id in ids:
            self.wait_gone(job_id, max(0.0, deadline - time.monotonic()))
        self._reap_steps(role)

    def _reap_steps(self, role: str) -> None:
        """The srun clients of restart steps end with their job; reap them (by pid)."""
        for key in [k for k in self._steps if k[0] == role]:
            proc = self._steps.pop(key)
            try:
                proc.wait(5.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def wait_finished(self, role: str, timeout: float) -> bool:
        """Wait (quietly) until every job of the role ends by itself; True if they did."""
        deadline = time.monotonic() + timeout
        return all(
            self.wait_gone(job_id, max(0.0, deadline - time.monotonic()), warn=False)
            for job_id in self.job_ids(role)
        )

    @staticmethod
    def wait_gone(job_id: str, timeout: float, warn: bool = True) -> bool:
        """Wait until the job has left squeue or reached a final state."""
        deadline = time.monotonic() + timeout
        interval = 0.05
        while True:
            try:
                r = _run(
                    ["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T"],
                    timeout=QUERY_TIMEOUT_SECONDS,
                )
            except SchedulerError as exc:
                r = subprocess.CompletedProcess([], 1, "", f"timed out: {exc}")
            state = r.stdout.strip()
            if r.returncode != 0 and _unreachable(r.stderr):
                pass  # slurmctld is down: the job's fate is unknown, keep asking
            elif r.returncode != 0 or not state or state_is_final(state):
                return True
            if time.monotonic() >= deadline:
                if not warn:
                    return False
                log.warning(
                    "Slurm job %s still %s %.0fs after scancel; check it with "
                    "`scontrol show job %s`",
                    job_id,
                    state,
                    timeout,
                    job_id,
                )
                return False
            time.sleep(interval)
            interval = min(interval * 1.5, 0.5)

    def close(self) -> None:
        for role in list(self._jobs):
            try:
                self.stop(role)
            except Exception as exc:
                log.warning("stopping Slurm job of %s: %s", role, exc)


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


# ---------------------------------------------------------------- scheduler --
class SlurmScheduler(Scheduler):
    """Workers are ``srun`` tasks of one ``sbatch`` job per role, on a cluster with a
    filesystem shared by the controller and every node (``cluster.fileroot``).

    Its options are :class:`corral.backends.options.SlurmOptions` (keywords, else
    ``cfg.scheduler.slurm``); ``nodelist``/``exclude`` there apply to every role (a
    role's ``SchedulingSpec.nodelist``/``exclude`` is used when they are None). ``python`` is the interpreter the nodes run workers with.
    ``dry_run=True`` submits nothing: ``create_workers`` prints the batch script and
    returns ``[]``; :meth:`render_script` returns it.

    Preemption is opt-in: ``requeue=True`` submits with ``--requeue`` (default
    ``--no-requeue``) and ``signal="USR1@60"`` adds ``--signal``. A requeued role's calls
    raise :class:`~corral.errors.WorkerPreemptedError`; engines get ``on_preempt(reason)``
    on the SIGTERM (and on the ``--signal`` warning); :meth:`wait_role` waits until
    Slurm runs the job again and returns the new workers (see docs/reliability.md).
    """

    backend = "slurm"

    def __init__(
        self,
        n_gpus_per_node: int | None = None,
        experiment_name: str | None = None,
        trial_name: str | None = None,
        fileroot: str | None = None,
        cluster_name: str | None = None,
        container_type: str | None = None,
        container_mounts: str | None = None,
        srun_additional_args: str | None = None,
        startup_timeout: float | None = None,
        health_check_interval: float | None = None,
        enable_tms_offload: bool | None = None,
        name_resolve_type: str | None = None,
        nfs_record_root: str | None = None,
        etcd3_addr: str | None = None,
        exp_config: Any = None,
        *,
        slurm: SlurmOptions | None = None,
        python: str = sys.executable,
        dry_run: bool = False,
        requeue: bool = False,
        signal: str | None = None,
        **kwargs: Any,
    ):
        """The first fifteen parameters are AReaL's ``SlurmScheduler``'s (an experiment
        config given first is taken as ``exp_config``); ``container_type`` and
        ``container_mounts`` override every role's spec when given, and
        ``srun_additional_args`` is added to ``srun_args``. Further keywords named like a
        :class:`SlurmOptions` field (``partition=...``) win over ``slurm``, which wins
        over ``cfg.scheduler.slurm``."""
        if exp_config is None and opts.looks_like_config(n_gpus_per_node):
            exp_config, n_gpus_per_node = n_gpus_per_node, None
        opts.check_exp_config(exp_config)
        experiment, trial = opts.names(exp_config, experiment_name, trial_name)
        if experiment is None or trial is None:
            raise ConfigError(
                "experiment_name/trial_name",
                (experiment, trial),
                "experiment_name and trial_name must be provided (or exp_config): they "
                "name the Slurm jobs and the shared directories",
            )
        for name, value in (
            ("cluster_name", cluster_name),
            ("container_type", container_type),
            ("container_mounts", container_mounts),
            ("srun_additional_args", srun_additional_args),
        ):
            opts.check_type(name, value, (str,), "a str")

        gpus = opts.n_gpus(exp_config, n_gpus_per_node)
        given = {k: kwargs.pop(k) for k in SlurmOptions.names() if k in kwargs}
        if slurm is not None:
            given = {**dataclasses.asdict(slurm), **given}
        given.setdefault("container_type", container_type)
        given.setdefault("container_mounts", container_mounts)
        options = SlurmOptions.resolve(exp_config, **given)
        if srun_additional_args:
            options.srun_args = [*options.srun_args, *shlex.split(srun_additional_args)]
        launcher = SlurmLauncher(
            n_gpus_per_node=gpus,
            options=options,
            python=python,
            dry_run=dry_run,
            requeue=requeue,
            signal=signal,
        )
        super().__init__(
            exp_config,
            launcher=launcher,
            n_gpus_per_node=gpus,
            startup_timeout=startup_timeout,
            experiment_name=experiment,
            trial_name=trial,
            fileroot=fileroot,
            health_check_interval=health_check_interval,
            enable_tms_offload=enable_tms_offload,
            name_resolve_type=name_resolve_type,
            nfs_record_root=nfs_record_root,
            etcd3_addr=etcd3_addr,
            dry_run=dry_run,
            **kwargs,
        )
        self.cluster_name = cluster_name or cluster_field(exp_config, "cluster_name")
        where = "cluster.fileroot (the log directory under it)"
        if dry_run:  # a dry run writes nothing, but refuses what the real run would
            check_dir(str(self.log_dir), where, create=False)
        else:
            self._ensure_dir(str(self.log_dir), where)

    def render_script(self, job: Any) -> str:
        """The exact batch script ``create_workers(job)`` submits (nothing is submitted)."""
        nj = normalize_job(job)
        if nj.is_colocated:
            raise ConfigError(
                "scheduling_strategy",
                nj.strategy.type,
                "a colocated role has no batch script of its own (it lives on its target's job)",
            )
        return self.dry_run(nj)

    @property
    def launcher_jobs(self) -> dict[str, str]:
        """Role -> the first Slurm job id of each role this scheduler submitted (a
        restarted replica runs in a job of its own: ``launcher.job_ids(role)``)."""
        return {role: jobs[0].job_id for role, jobs in self.launcher._jobs.items() if jobs}


def render_dry_run(cfg: Any, role: str, replicas: int) -> str:
    """The batch script of ``replicas`` workers of ``role`` under ``cfg`` on Slurm,
    whatever ``cfg.scheduler.type`` says (``corral.dryrun.from_config`` follows it)."""
    sched = SlurmScheduler(exp_config=cfg, dry_run=True)
    try:
        return sched.dry_run(job_of(cfg, role, replicas))
    finally:
        sched.close()


__all__ = [
    "ACTIVE",
    "ENDED",
    "PENDING",
    "UNKNOWN",
    "SlurmLauncher",
    "SlurmScheduler",
    "classify_state",
    "ending_state_from_log",
    "describe_state",
    "normalize_state",
    "parse_exit_code",
    "render_dry_run",
    "state_is_final",
]
