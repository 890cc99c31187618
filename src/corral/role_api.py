"""The roles half of the public API: create a role's workers (launched, colocated or
forked), wait for them and give them their rendezvous variables, look them up, scale a
role and wait for it after a preemption. A mixin of ``corral.scheduler.Scheduler``."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from corral import name_resolve_keys
from corral import scheduler_keywords as opts
from corral.configure import configure_all
from corral.dryrun import plan
from corral.errors import WorkerNotFoundError
from corral.fdlimit import ensure_fds, is_fd_exhaustion, too_many_files
from corral.forking import fork_next_to, fork_via_worker
from corral.grouping import fork_groups, is_grouped, plan_groups, slots_of
from corral.instances import start_instances
from corral.launcher import LaunchRequest
from corral.multinode import Instance, nodes_of
from corral.rendezvous import rendezvous_envs
from corral.roles import FORKED, LAUNCHED, REUSED, RoleState
from corral.safedirs import make_private_subdir
from corral.spec import (
    NormalizedJob,
    SchedulingSpec,
    Worker,
    normalize_job,
    validate_role_name,
)
from corral.stop_deadline import STOP_DEADLINE_ENV, check_stop_deadline
from corral.worker import env as E


class RoleAPI:
    """Needs the pieces ``Scheduler.__init__`` wires: ``launcher``, ``_table``,
    ``_roles``, ``_watch``, ``_calls``, ``_teardown``, ``_io``, ``_lock``, ``paths`` and
    the trial's names and settings."""

    def worker_env(self, role: str, index: int, spec: SchedulingSpec) -> dict[str, str]:
        """The environment every backend gives a worker process."""
        by_launcher = not self.launcher.shares_filesystem  # it hands the secret over itself
        return E.worker_environment(
            experiment=self.experiment_name,
            trial=self.trial_name,
            role=role,
            index=index,
            name_resolve=self.name_resolve.describe(),
            log_dir=self.paths.log_dir,
            port_count=spec.port_count,
            lease_timeout=self.lease_timeout,
            cpu=spec.cpu,
            run_id=self.run_id,
            fileroot=self.fileroot,
            secret_file=None if by_launcher else self.secret_file,
            engines=spec.engines,
            env_vars=spec.env_vars,
            offload=self.enable_tms_offload,
            outlive=self.outlive_controller,
        )

    def create_workers(self, job: Any, *args: Any, wait: bool = True, **kwargs: Any) -> list[str]:
        """Start ``job.replicas`` workers of ``job.role`` and wait until all are ready.

        ``wait=False`` returns once the workers are launched, as AReaL's schedulers do;
        ``get_workers(role, timeout)`` then waits for them (and any call on one of them
        waits up to ``startup_timeout``)."""
        if self.dry_run_only:
            print(self.dry_run(job))
            return []
        nj = normalize_job(job)
        with self._lock:
            self._check_job(nj)
            if nj.is_colocated:
                self._finish_role(nj.strategy.target, self.startup_timeout)
            if nj.is_colocated and not nj.strategy.fork:
                target = self._roles[nj.strategy.target]
                self._roles[nj.role] = RoleState(
                    nj, list(target.workers), REUSED, nj.strategy.target
                )
                return [w.id for w in target.workers]
            if nj.is_colocated:
                return self._fork_role(nj, nj.strategy.target)
            return self._launch_role(nj, wait)

    def dry_run(self, job: Any) -> str:
        """What ``create_workers(job)`` would ask the backend for, as printable text (the
        local argv and environment, the Ray placement groups and actor options, the
        sbatch script), after the same checks. Starts and writes nothing."""
        return plan(self, normalize_job(job))

    def _check_job(self, job: NormalizedJob) -> None:
        check_stop_deadline(dict(os.environ), f"environment variable {STOP_DEADLINE_ENV}")
        self._table.check_new(job, self._n_gpus_per_node, self.launcher, self.backend)

    def _launch_role(self, job: NormalizedJob, wait: bool = True) -> list[str]:
        ensure_fds(job.replicas * self.launcher.fds_per_worker, f"role {job.role!r}")
        self._hold_lease()
        self.name_resolve.clear_subtree(self._key(name_resolve_keys.role_prefix, job.role))
        envs = [self.worker_env(job.role, i, spec) for i, spec in enumerate(job.tasks)]
        make_private_subdir(self.log_dir)  # 0700, like every directory below
        self.progress(
            f"starting {job.replicas} {job.role} worker(s) on {self.backend}; logs in {self.log_dir}"
        )
        try:
            self.launcher.launch(LaunchRequest(job=job, envs=envs, log_dir=self.paths.log_dir))
            self._roles[job.role] = RoleState(job, [], LAUNCHED, pending=True)
            if wait:
                self._finish_role(job.role, self.startup_timeout)
        except BaseException as exc:
            self._roles.pop(job.role, None)
            self._teardown.stop_launched(job.role)
            if is_fd_exhaustion(exc):
                import resource

                soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
                needed = job.replicas * self.launcher.fds_per_worker
                raise too_many_files(f"role {job.role!r}", needed, soft, hard) from exc
            raise
        return [f"{job.role}/{i}" for i in range(job.replicas)]

    def _finish_role(self, role: str, timeout: float) -> None:
        """Wait until a launched role's workers registered, then give them their
        rendezvous variables and (with an ``exp_config``) configure them."""
        state = self._roles.get(role)
        if state is None or not state.pending:
            return
        started = time.monotonic()
        workers = self._watch.await_registration(role, state.job.replicas, timeout)
        self._rendezvous(role, workers)
        k = nodes_of(state.job.tasks[0], self._n_gpus_per_node)
        if k > 1:  # multi-node instances: their members, and everyone's node variables
            state.instances, members = start_instances(
                workers,
                k,
                lambda name, n: self._watch.await_registration(name, n, timeout),
                lambda envs: self._io.run(
                    self._calls.acall_all([(w, "/set_env", {"env": e}) for w, e in envs])
                ),
            )
            self._table.add_workers(members)
        if self.exp_config is not None:
            self._io.run(configure_all(self._calls, workers, self.exp_config))
        state.workers, state.pending = workers, False
        self._table.add_workers(workers)
        self.progress(f"{len(workers)} {role} worker(s) ready in {time.monotonic() - started:.2f}s")

    def _rendezvous(self, role: str, workers: list[Worker], only: list[int] | None = None) -> None:
        """Give each worker its torch.distributed variables (``only``: just these ranks)."""
        master = self.launcher.rendezvous_master(role, workers)
        envs = rendezvous_envs(workers, master)
        pairs = list(zip(workers, envs, strict=True))
        if only is not None:
            pairs = [pairs[i] for i in only]
        pairs = [(w, env) for w, env in pairs if not w.foreign]  # corral.foreign: its own API
        self._io.run(self._calls.acall_all([(w, "/set_env", {"env": env}) for w, env in pairs]))

    def scale(self, role: str, replicas: int) -> list[str]:
        """Grow or shrink a launched role to ``replicas`` workers; see corral.elastic."""
        from corral.elastic import scale

        return scale(self, role, replicas)

    def wait_role(self, role: str, timeout: float | None = None) -> list[str]:
        """After a preemption (WorkerPreemptedError): wait until the backend brought every
        worker of ``role`` back, re-run rendezvous and the restart hook; see
        corral.preemption."""
        from corral.preemption import wait_role

        return wait_role(self, role, timeout)

    def fork_workers(self, role: str, target_role: str, command: str | None = None) -> list[str]:
        """Start one new worker of ``role`` next to each worker of ``target_role``."""
        validate_role_name(role)
        with self._lock:
            if target_role not in self._roles:
                raise WorkerNotFoundError(
                    target_role, f"no role {target_role!r} to fork from; create it first"
                )
            target = self._roles[target_role]
            job = NormalizedJob(
                role=role,
                replicas=len(target.workers),
                tasks=target.job.tasks,
                strategy=type(target.job.strategy)(
                    type="colocation", target=target_role, fork=True
                ),
            )
            self._check_job(job)
            return self._fork_role(job, target_role, command)

    def _fork_role(
        self, job: NormalizedJob, target_role: str, command: str | None = None
    ) -> list[str]:
        self._hold_lease()
        targets = self._roles[target_role].workers
        self.name_resolve.clear_subtree(self._key(name_resolve_keys.role_prefix, job.role))
        self.progress(f"forking {len(targets)} {job.role} worker(s) next to {target_role}")
        state = RoleState(job, [], FORKED, target_role)
        self._roles[job.role] = state

        try:
            if is_grouped(job, len(targets)):  # a few workers over many (corral.grouping)
                state.workers, state.hosts = self._fork_grouped(job, targets)
            else:
                state.workers = fork_next_to(
                    self.launcher,
                    self._calls,
                    job,
                    targets,
                    command,
                    self.startup_timeout,
                    self._fan_out,
                )
            self._rendezvous(job.role, state.workers)
        except BaseException:
            self._teardown.delete_role(job.role)
            raise
        self._table.add_workers(state.workers)
        return [w.id for w in state.workers]

    def _fork_grouped(
        self, job: NormalizedJob, targets: list[Worker]
    ) -> tuple[list[Worker], dict[int, int]]:
        """Grouped workers over ``targets``' GPUs, as their registrations list them."""

        def devices(w: Worker) -> str | None:
            info = self.name_resolve.get(
                self._key(name_resolve_keys.worker_info_key, w.role, w.index)
            )
            return json.loads(info).get("gpus") if info else None

        groups = plan_groups(job, slots_of(targets, [devices(w) for w in targets]))

        def fork_one(host: Worker, index: int, env: dict[str, str]) -> Worker:
            return fork_via_worker(
                self._calls, host, job.role, index, env, None, self.startup_timeout
            )

        workers = fork_groups(fork_one, job, groups, targets, self._fan_out)
        return workers, {g.index: g.host for g in groups}

    def instance(self, worker_id: str) -> Instance:
        """A multi-node worker's instance (docs/shapes.md): its member workers, one per
        node after the first (``create_engine``/``call_engine`` them by id to start the
        server's per-node processes), the node hosts and the head's address; each
        process has CORRAL_NNODES, CORRAL_NODE_RANK, CORRAL_HEAD_ADDR, CORRAL_HEAD_PORT."""
        worker = self._table.worker(worker_id)
        state = self._table.state(worker.role)
        if not state.instances:
            raise WorkerNotFoundError(
                worker_id, f"{worker_id} is not a multi-node worker (gpu <= n_gpus_per_node)"
            )
        return state.instances[worker.index]

    def get_workers(self, role: str, timeout: float | None = None) -> list[Worker]:
        """The role's workers once ready; raises WorkerFailedError if one has died.

        Workers made by ``create_workers`` are ready when it returns; those launched with
        ``wait=False`` are waited for here, for ``timeout`` seconds (None: the scheduler's
        ``startup_timeout``), then WorkerTimeoutError (the role stays, call again or
        delete it)."""
        state = self._table.state(role)
        opts.check_number("timeout", timeout)
        wait = self.startup_timeout if timeout is None else timeout
        if state.kind == REUSED:
            self._finish_role(state.target, wait)
            state.workers = list(self._roles[state.target].workers)
        with self._lock:
            self._finish_role(role, wait)
        self._watch.raise_if_dead(state)
        return list(state.workers)
