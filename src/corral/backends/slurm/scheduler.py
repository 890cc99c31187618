"""SlurmScheduler: the shared :class:`~corral.controller.scheduler.Scheduler` over
:class:`~corral.backends.slurm.launcher.SlurmLauncher`, with AReaL's ``SlurmScheduler``
constructor.

Everything that happens once a worker is reachable (health, engines, calls, fork via
``POST /fork``, colocation, teardown order) is the shared Scheduler's. ``dry_run=True``:
``create_workers`` prints the batch script it would submit and returns ``[]`` without
submitting anything; :meth:`SlurmScheduler.render_script` returns the script as text.
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
from typing import Any

from corral import scheduler_keywords as opts
from corral.backends.backend_options import SlurmOptions
from corral.backends.slurm.launcher import SlurmLauncher
from corral.config import cluster_field
from corral.controller.scheduler import Scheduler
from corral.errors import ConfigError
from corral.paths import check_dir
from corral.spec import normalize_job


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
        return self.launcher.first_job_ids()
