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
from typing import Any

from corral import scheduler_keywords as opts
from corral.backends.backend_options import SlurmOptions
from corral.backends.sbatch import (
    SbatchParams,
    check_container,
    check_homogeneous,
    plan_layout,
    render_sbatch_script,
)
from corral.backends.slurm_adopt import SlurmAdoption, cancel_trial_jobs
from corral.backends.slurm_cluster import fit_problem, read_inventory
from corral.backends.slurm_elastic import SlurmElastic
from corral.backends.slurm_queue import (  # the state names stay importable from here
    ACTIVE,
    ENDED,
    PENDING,
    UNKNOWN,
    RoleJob,
    SlurmQueue,
    _require,
    _run,
    classify_state,
    describe_state,
    ending_state_from_log,
    normalize_state,
    parse_exit_code,
    requeue_count,
    state_is_final,
)
from corral.backends.slurm_requeue import SlurmPreemption
from corral.backends.slurm_resources import SlurmResources, read_resources, resource_problem
from corral.backends.slurm_restart import SlurmRestarts
from corral.backends.slurm_stop import SlurmStop
from corral.backends.slurm_watch import SlurmWatch
from corral.config import cluster_field
from corral.dryrun import job_of
from corral.errors import ConfigError, PlacementError
from corral.launcher import Launcher, LaunchRequest
from corral.paths import TrialPaths, check_dir, exit_code_path, replica_exit_files
from corral.safedirs import make_private_subdir, write_private
from corral.scheduler import Scheduler
from corral.spec import NormalizedJob, normalize_job
from corral.worker import env as E

log = logging.getLogger("corral")


# ----------------------------------------------------------------- launcher --
class SlurmLauncher(
    SlurmWatch,
    SlurmRestarts,
    SlurmElastic,
    SlurmPreemption,
    SlurmAdoption,
    SlurmStop,
    Launcher,
):
    """One ``sbatch`` job per role; this class renders, checks and submits.

    Its capabilities live in mixins, one module each: ``slurm_watch`` (poll, pending
    reasons, hopeless queue reasons), ``slurm_restart`` (a replica again, as a step or a
    job), ``slurm_elastic`` (grow, shrink), ``slurm_requeue`` (preemption),
    ``slurm_adopt`` (a dead controller's jobs), ``slurm_stop`` (stop, close)."""

    name = "slurm"

    elastic = preemption = adoption = property(lambda self: self)  # its own parts, for now
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
        self._resources: SlurmResources | None = None
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
        if self._resources is None:
            self._resources = read_resources(_run) or SlurmResources()
        partition = spec.partition or self.options.partition
        problem = resource_problem(
            self._resources, partition, spec.constraint, spec.reservation
        ) or fit_problem(self._inventory, partition, layout.nodes, layout.gpus_per_node)
        if problem is not None:
            name, value, why = problem
            raise PlacementError(
                f"{job.role}: {name}", value, f"{job.role} can never be placed: {why}"
            )

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
        """Remove the exit file of replica ``index`` in job ``job_id``; without a job id,
        every exit file the replica has (of any job), before a new job is submitted.

        Slurm reuses job ids (a controller cold start begins again at FirstJobId, ids wrap
        at MaxJobId), so a file an earlier run of the same trial left under the id the new
        job gets would make the new replica look dead before it starts."""
        paths = (
            [exit_code_path(log_dir, role, index, job_id)]
            if job_id
            else replica_exit_files(log_dir, role, index)
        )
        for path in paths:
            try:
                os.unlink(path)
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

    def job_id(self, role: str) -> str | None:
        """The role's first job (restarted replicas run in jobs of their own)."""
        jobs = self._jobs.get(role)
        return jobs[0].job_id if jobs else None

    def job_ids(self, role: str) -> list[str]:
        """Every job of the role: the first, then one per restart."""
        return [j.job_id for j in self._jobs.get(role, ())]


# ---------------------------------------------------------------- scheduler --
class SlurmScheduler(Scheduler):
    """Workers are ``srun`` tasks of one ``sbatch`` job per role, on a cluster with a
    filesystem shared by the controller and every node (``cluster.fileroot``).

    Its options are :class:`corral.backends.backend_options.SlurmOptions` (keywords, else
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

    @opts.config_first
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
    "cancel_trial_jobs",
    "classify_state",
    "ending_state_from_log",
    "describe_state",
    "normalize_state",
    "parse_exit_code",
    "render_dry_run",
    "requeue_count",
    "state_is_final",
]
