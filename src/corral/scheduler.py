"""The shared controller: roles, colocation, fork, engines, calls, health and teardown.

A backend contributes only a ``Launcher``; everything that happens once a worker is
reachable is written here once.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import logging
import os
import secrets
import socket
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corral import envvars, keys
from corral import options as opts
from corral.config import cluster_field, scheduler_field
from corral.data.plane import DataPlane
from corral.data.store import parse_keep
from corral.discovery import NameResolve, make_name_resolve
from corral.discovery.signed import SignedNameResolve
from corral.errors import (
    ConfigError,
    CorralError,
    EngineCallError,
    EngineTypeError,
    GPURequestError,
    JobConfigError,
    PlacementError,
    SchedulerError,
    UnknownRoleError,
    WorkerConfigurationError,
    WorkerConnectionError,
    WorkerCreationError,
    WorkerFailedError,
    WorkerNotFoundError,
    WorkerTimeoutError,
)
from corral.fdlimit import ensure_fds, is_fd_exhaustion, too_many_files
from corral.health import DEFAULT_INTERVAL, HealthMonitor, WorkerHealth, health_key
from corral.ioloop import IOLoop
from corral.launcher import Launcher, LaunchRequest, WorkerExit
from corral.leftovers import clean_dead_run
from corral.logs import log_dir_for, replica_log_path, tail
from corral.observe.publisher import StatsPublisher, make_call_stats
from corral.rpc import wire
from corral.rpc.client import AsyncRPCClient, RPCClient, WorkerUnreachableError, new_request_id
from corral.runs import ControllerLease, Lease, new_run_id
from corral.safedirs import ensure_private_dir, make_private_subdir, write_exclusive
from corral.spec import NormalizedJob, SchedulingSpec, Worker, normalize_job, validate_role_name
from corral.worker import env as E

log = logging.getLogger("corral")
DEAD_CHECK_SECONDS = 1.5
STATUS_POLL_SECONDS = 0.25


@dataclass
class RoleState:
    job: NormalizedJob
    workers: list[Worker]
    kind: str  # "launched" | "forked" | "reused"
    target: str | None = None
    pending: bool = False  # launched, not yet registered (create_workers(wait=False))
    engines: dict[str, set[str]] = field(default_factory=dict)
    restarts: dict[int, int] = field(default_factory=dict)


class Scheduler:
    """One API over every backend. Subclasses pick a ``Launcher``."""

    backend = "base"

    def __init__(
        self,
        exp_config: Any = None,
        *,
        launcher: Launcher,
        n_gpus_per_node: int | None = None,
        startup_timeout: float | None = None,
        fileroot: str | None = None,
        name_resolve: NameResolve | None = None,
        lease_timeout: float = E.DEFAULT_LEASE_TIMEOUT,
        progress: Callable[[str], None] | None = None,
        experiment_name: str | None = None,
        trial_name: str | None = None,
        log_dir: str | None = None,
        health_check_interval: float | None = None,
        enable_tms_offload: bool | None = None,
        name_resolve_type: str | None = None,
        nfs_record_root: str | None = None,
        etcd3_addr: str | None = None,
        on_worker_death: Callable[[str, WorkerExit], Any] | None = None,
        health_interval: float = DEFAULT_INTERVAL,
    ):
        """Options as in AReaL (see corral.options): an ``exp_config`` wins over the
        keywords it also holds, except ``fileroot``; ``log_dir`` replaces the log directory."""
        self.exp_config = exp_config = opts.check_exp_config(exp_config)
        experiment, trial = opts.names(exp_config, experiment_name, trial_name)
        self.experiment_name = validate_role_name(experiment or "corral", "experiment_name")
        self.trial_name = validate_role_name(trial or "trial0", "trial_name")
        self._n_gpus_per_node = opts.n_gpus(exp_config, n_gpus_per_node)
        if self._n_gpus_per_node < 0:
            raise ConfigError("n_gpus_per_node", self._n_gpus_per_node, "use a whole number >= 0")
        timeout = opts.check_number("startup_timeout", startup_timeout)
        self.startup_timeout = float(
            timeout if timeout is not None else scheduler_field(exp_config, "startup_timeout")
        )
        interval = opts.check_number("health_check_interval", health_check_interval)
        self.health_check_interval = interval if interval is not None else 1.0
        self.enable_tms_offload = opts.offload(exp_config, enable_tms_offload)
        self.fileroot = os.path.abspath(opts.fileroot(exp_config, fileroot))
        ensure_private_dir(self.fileroot, "cluster.fileroot")
        opts.check_type("log_dir", log_dir, (str, os.PathLike), "a directory path")
        #: A pathlib.Path, as in AReaL (``str(sched.log_dir)`` for the text).
        self.log_dir = Path(
            os.path.abspath(os.fspath(log_dir))
            if log_dir is not None
            else log_dir_for(self.fileroot, self.experiment_name, self.trial_name)
        )
        if log_dir is not None:
            self._ensure_dir(str(self.log_dir), "log_dir")
        self.secret = secrets.token_hex(32)  # in memory; the file is written at claim
        resolve_cfg = opts.name_resolve(exp_config, name_resolve_type, nfs_record_root, etcd3_addr)
        # records are signed with the trial secret; unsigned or forged ones are refused
        self.name_resolve = SignedNameResolve(
            name_resolve
            or make_name_resolve(
                resolve_cfg
                if resolve_cfg is not None
                else cluster_field(exp_config, "name_resolve"),
                self.fileroot,
            ),
            self.secret,
        )
        self.lease_timeout = lease_timeout
        self.launcher = launcher
        self.progress = progress or (lambda text: log.info(text))
        launcher.progress = self.progress
        launcher.trial_secret = self.secret
        self.secret_file = os.path.join(
            self.fileroot, "secrets", self.experiment_name, self.trial_name, "secret"
        )
        self.run_id = new_run_id()
        self.removed_leftovers: list[str] = []
        self._lease = ControllerLease(
            SignedNameResolve(self.name_resolve.inner, self.secret, lenient=True),
            self.experiment_name,
            self.trial_name,
            self.run_id,
            lease_timeout,
        )
        self._client = RPCClient(self.secret)
        self._async_client = AsyncRPCClient(self.secret)
        self._roles: dict[str, RoleState] = {}
        self._ids: dict[str, Worker] = {}
        self._lock = threading.RLock()
        self._restart_hooks: dict[str, Callable[[Scheduler, str], Any]] = {}
        self._unrestartable: dict[str, str] = {}
        # Blocking launcher work (Ray forks) fans out on a few threads; requests to many
        # workers at once (rendezvous, teardown) run as coroutines on one loop thread.
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="corral-fanout")
        self._io = IOLoop()
        self.monitor = HealthMonitor(
            self._watched_roles, launcher.poll, self._record_health, self.progress, health_interval
        )
        if on_worker_death is not None:
            self.monitor.callbacks.append(on_worker_death)
        self._closed = False
        self._calls = make_call_stats()  # per-role call figures for corral dashboard / top
        self._stats = StatsPublisher(self, self._calls)
        self._data = DataPlane(
            f"{self.experiment_name}/{self.trial_name}",
            self._ids.get,
            lambda w, path, payload, timeout: self._request(w, path, payload, timeout, 0),
            lambda w, path, payload, timeout: self._arequest(w, path, payload, timeout, 0),
        )
        _live_schedulers.add(self)

    # ------------------------------------------------------------------ setup
    @property
    def n_gpus_per_node(self) -> int:
        return self._n_gpus_per_node

    @staticmethod
    def _ensure_dir(path: str, field_name: str) -> None:
        try:
            make_private_subdir(path)
        except OSError as exc:
            raise ConfigError(
                field_name, path, f"cannot create it ({exc.strerror}); use a writable directory"
            ) from None
        if not os.access(path, os.W_OK | os.X_OK):
            raise ConfigError(field_name, path, "it is not writable; use a writable directory")

    @staticmethod
    def _check_dir_creatable(path: str, field_name: str) -> None:
        """What ``_ensure_dir`` checks, without creating anything (for dry runs)."""
        probe = os.path.abspath(path)
        while not os.path.lexists(probe):
            probe = os.path.dirname(probe)
        if not os.path.isdir(probe):
            raise ConfigError(
                field_name,
                path,
                f"cannot create it: {probe} is a file, not a directory; "
                "remove it or use another directory",
            )
        if not os.access(probe, os.W_OK | os.X_OK):
            raise ConfigError(
                field_name, path, f"{probe} is not writable; use a writable directory"
            )

    @property
    def secrets_dir(self) -> str:
        """``<fileroot>/secrets/<experiment>/<trial>`` (not created here)."""
        return os.path.dirname(self.secret_file)

    def _read_secret_file(self) -> str | None:
        try:
            with open(self.secret_file) as fh:
                return fh.read().strip() or None
        except OSError:
            return None

    def _write_secret(self) -> str:
        """Written when the run claims its trial (never by a dry run): a second live
        controller is refused before it gets here, a dead run's file is replaced, and
        the file is created exclusively (0600, no symlink followed) in a 0700 directory.
        """
        make_private_subdir(os.path.dirname(self.secret_file))
        write_exclusive(self.secret_file, self.secret)
        self._wrote_secret = True
        return self.secret_file

    def _remove_secret(self) -> None:
        """At close: delete the secret file if it is still this run's."""
        if getattr(self, "_wrote_secret", False) and self._read_secret_file() == self.secret:
            try:
                os.unlink(self.secret_file)
            except OSError:
                pass

    def _key(self, fn, *args) -> str:
        return fn(self.experiment_name, self.trial_name, *args)

    # ------------------------------------------------------------ controller lease
    def _ensure_lease(self) -> None:
        """Claim the trial for this run before anything starts (see corral.runs)."""
        if self._lease.held:
            return
        old_secret = self._read_secret_file()

        def cleanup(old: Lease) -> list[str]:
            old_records = self.name_resolve.inner  # the dead run's records: its own key
            removed = clean_dead_run(
                SignedNameResolve(old_records, old_secret) if old_secret else old_records,
                self.experiment_name,
                self.trial_name,
                old,
                old_secret,
                self.launcher.remove_leftovers,
            )
            if removed:
                self.progress(
                    f"cleaned up after the dead controller of {self.experiment_name}/"
                    f"{self.trial_name} ({old.describe()}): " + "; ".join(removed)
                )
            return removed

        self.removed_leftovers = self._lease.claim(cleanup)
        self._write_secret()
        self._stats.start()  # the stats file for corral dashboard / top (checks its env first)
        self.monitor.start()

    def _drop_lease(self) -> None:
        self.monitor.stop()
        if self._lease.held:
            self._stats.stop()
        self._lease.release()

    # ------------------------------------------------------------ health monitor
    def _watched_roles(self) -> dict[str, list[str]]:
        return {
            role: [w.id for w in state.workers]
            for role, state in list(self._roles.items())
            if state.kind != "reused"
        }

    def _record_health(self, role: str, index: int, health: WorkerHealth) -> None:
        key = health_key(self.experiment_name, self.trial_name, role, index)
        self.name_resolve.add(key, health.dump(self.run_id), replace=True)

    def on_worker_death(self, callback: Callable[[str, WorkerExit], Any]) -> None:
        """Call ``callback(worker_id, exit)`` from the health monitor's thread when a
        worker is found dead (within ``health_interval`` plus the backend's own delay),
        whether or not a call to it is in flight."""
        self.monitor.callbacks.append(callback)

    def worker_status(self) -> dict[str, str]:
        """``worker_id -> "alive"`` or ``"dead: <reason>"``, as the health monitor knows."""
        status = {}
        for ids in self._watched_roles().values():
            for worker_id in ids:
                dead = self.monitor.dead.get(worker_id)
                status[worker_id] = f"dead: {dead.reason}" if dead else "alive"
        return status

    # ----------------------------------------------------------- worker env
    def worker_env(self, role: str, index: int, spec: SchedulingSpec) -> dict[str, str]:
        """The environment every backend gives a worker process."""
        env = {
            E.EXPERIMENT: self.experiment_name,
            E.TRIAL: self.trial_name,
            E.ROLE: role,
            E.INDEX: str(index),
            E.NAME_RESOLVE: json.dumps(self.name_resolve.describe()),
            E.LOG_DIR: str(self.log_dir),
            E.PORT_COUNT: str(spec.port_count),
            E.LEASE_TIMEOUT: str(self.lease_timeout),
            E.CONTROLLER_PID: str(os.getpid()),
            E.CONTROLLER_HOST: socket.gethostname(),
            E.FILEROOT: self.fileroot,
            E.RUN_ID: self.run_id,
            "PYTHONUNBUFFERED": "1",
        }
        if not self.launcher.share_secret_by_env():  # else the launcher hands it over
            env[E.SECRET_FILE] = self.secret_file  # written when the run claims the trial
        if spec.engines:
            env[E.ENGINES] = json.dumps(spec.engines)
        env.update(envvars.controller_env(spec.cpu, spec.env_vars, self.enable_tms_offload))
        env.update(spec.env_vars)
        return env

    # ------------------------------------------------------------- validation
    def _check_job(self, job: NormalizedJob) -> None:
        if job.role in self._roles:
            raise JobConfigError(
                "job.role",
                job.role,
                "Worker group already exists: this role already exists; delete_workers(role) "
                "first or use another name",
                job.role,
            )
        if job.is_colocated:
            target = job.strategy.target
            if target not in self._roles:
                known = ", ".join(self._roles) or "none"
                raise UnknownRoleError(
                    "scheduling_strategy.target",
                    target,
                    f"create that role first (roles: {known})",
                    job.role,
                )
            n_target = len(self._roles[target].workers)
            if job.replicas != n_target:
                raise JobConfigError(
                    "job.replicas",
                    job.replicas,
                    f"Replica count mismatch: a role colocated with {target!r} needs "
                    f"replicas={n_target}, one per target worker",
                    job.role,
                )
            return
        for i, spec in enumerate(job.tasks):
            if spec.gpu > self._n_gpus_per_node:
                raise GPURequestError(
                    f"job.tasks[{i}].gpu",
                    spec.gpu,
                    f"a worker cannot use more GPUs than a node has (n_gpus_per_node={self._n_gpus_per_node})",
                    job.role,
                )
        if any(spec.max_restarts for spec in job.tasks) and not self.launcher.supports_restart():
            raise ConfigError(
                "SchedulingSpec.max_restarts",
                max(spec.max_restarts for spec in job.tasks),
                f"the {self.backend} backend cannot restart workers; use 0 (fail fast)",
            )
        self.launcher.check(job)

    # ------------------------------------------------------------ create
    def create_workers(self, job: Any, *args: Any, wait: bool = True, **kwargs: Any) -> list[str]:
        """Start ``job.replicas`` workers of ``job.role`` and wait until all are ready.

        ``wait=False`` returns once the workers are launched, as AReaL's schedulers do;
        ``get_workers(role, timeout)`` then waits for them (and any call on one of them
        waits up to ``startup_timeout``)."""
        nj = normalize_job(job)
        with self._lock:
            self._check_job(nj)
            if nj.is_colocated:
                self._finish_role(nj.strategy.target, self.startup_timeout)
            if nj.is_colocated and not nj.strategy.fork:
                target = self._roles[nj.strategy.target]
                self._roles[nj.role] = RoleState(
                    nj, list(target.workers), "reused", nj.strategy.target
                )
                return [w.id for w in target.workers]
            if nj.is_colocated:
                return self._fork_role(nj, nj.strategy.target)
            return self._launch_role(nj, wait)

    def _launch_role(self, job: NormalizedJob, wait: bool = True) -> list[str]:
        ensure_fds(job.replicas * self.launcher.fds_per_worker, f"role {job.role!r}")
        self._ensure_lease()
        self.name_resolve.clear_subtree(self._key(keys.role_prefix, job.role))
        envs = [self.worker_env(job.role, i, spec) for i, spec in enumerate(job.tasks)]
        make_private_subdir(self.log_dir)  # 0700, like every directory below
        self.progress(
            f"starting {job.replicas} {job.role} worker(s) on {self.backend}; logs in {self.log_dir}"
        )
        try:
            self.launcher.launch(LaunchRequest(job=job, envs=envs, log_dir=str(self.log_dir)))
            self._roles[job.role] = RoleState(job, [], "launched", pending=True)
            if wait:
                self._finish_role(job.role, self.startup_timeout)
        except BaseException as exc:
            self._roles.pop(job.role, None)
            self._stop_launched(job.role)
            if is_fd_exhaustion(exc):
                import resource

                soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
                raise too_many_files(f"role {job.role!r}", job.replicas * 5, soft, hard) from exc
            raise
        return [f"{job.role}/{i}" for i in range(job.replicas)]

    def _finish_role(self, role: str, timeout: float) -> None:
        """Wait until a launched role's workers registered, then give them their
        rendezvous variables and (with an ``exp_config``) configure them."""
        state = self._roles.get(role)
        if state is None or not state.pending:
            return
        started = time.monotonic()
        workers = self._await_registration(role, state.job.replicas, timeout)
        self._rendezvous(role, workers)
        if self.exp_config is not None:
            self._configure_all(workers)
        state.workers, state.pending = workers, False
        for w in workers:
            self._ids[w.id] = w
        self.progress(f"{len(workers)} {role} worker(s) ready in {time.monotonic() - started:.2f}s")

    def _configure_all(self, workers: list[Worker]) -> None:
        """AReaL's ``/configure`` call at creation: the config, role and rank (the worker
        seeds its random generators from ``config.seed`` + rank)."""

        config = self._sendable_config()

        async def configure(rank: int, worker: Worker) -> None:
            payload = {"config": config, "role": worker.role, "rank": rank}
            try:
                await self._arequest(worker, "/configure", payload)
            except SchedulerError as exc:
                if isinstance(exc, WorkerFailedError | WorkerTimeoutError):
                    raise
                raise WorkerConfigurationError(worker.id, str(exc)) from exc

        async def configure_all() -> None:  # one I/O loop, as the rendezvous
            try:
                await asyncio.gather(*(configure(r, w) for r, w in enumerate(workers)))
            finally:
                self._async_client.forget_all()

        self._io.run(configure_all())

    def _sendable_config(self) -> Any:
        """The experiment config as sent by ``/configure``; a config holding values the
        wire cannot carry (a class, a function) is replaced by its ``seed`` alone, with a
        warning, so that workers are still seeded."""
        try:
            wire.encode(self.exp_config)
            return self.exp_config
        except TypeError as exc:
            seed = getattr(self.exp_config, "seed", None)
            log.warning(
                "the experiment config cannot be sent to workers (%s); they get only its "
                "seed (%r) in /configure",
                exc,
                seed,
            )
            return {"seed": seed} if seed is not None else None

    def _await_registration(self, role: str, replicas: int, timeout: float) -> list[Worker]:
        deadline = time.monotonic() + timeout
        found: dict[int, Worker] = {}
        next_poll = next_report = next_reason = 0.0
        started = time.monotonic()
        last_reason: str | None = None
        interval = 0.005
        while True:
            now = time.monotonic()
            for index in range(replicas):
                if index not in found:
                    worker = self._read_worker(role, index)
                    if worker is not None:
                        found[index] = worker
            if len(found) == replicas:
                return [found[i] for i in range(replicas)]
            if now >= next_poll:
                dead = self.launcher.poll(role)
                if dead:
                    index, exit_ = sorted(dead.items())[0]
                    raise self._failure(f"{role}/{index}", exit_, role, index, "while starting")
                hopeless = self.launcher.hopeless(role)
                if hopeless:
                    raise PlacementError(
                        f"{role}: placement",
                        f"{replicas} worker(s)",
                        f"{role} can never be placed: {hopeless}. Lower replicas or "
                        "resources, or pick another partition",
                    )
                next_poll = now + STATUS_POLL_SECONDS
            if now >= next_reason and len(found) < replicas:
                reason = self.launcher.pending_reason(role)
                if reason and reason != last_reason and now - started > 1.0:
                    self.progress(f"waiting for {role} ({len(found)}/{replicas} ready): {reason}")
                    last_reason = reason
                next_reason = now + 1.0
            if now >= deadline:
                reason = self.launcher.pending_reason(role)
                missing = [f"{role}/{i}" for i in range(replicas) if i not in found]
                raise WorkerTimeoutError(
                    role,
                    timeout,
                    f"{len(missing)} of {replicas} {role} worker(s) not ready after {timeout:g}s "
                    f"({', '.join(missing[:8])})"
                    + (f"; backend says: {reason}" if reason else "")
                    + f". Check the logs in {self.log_dir} or raise startup_timeout.",
                )
            if now >= next_report and now - (deadline - timeout) > 5:
                self.progress(f"waiting for {role}: {len(found)}/{replicas} ready")
                next_report = now + 5
            time.sleep(interval)
            interval = min(interval * 1.5, 0.05)

    def _read_worker(self, role: str, index: int) -> Worker | None:
        address = self.name_resolve.get(self._key(keys.worker_address_key, role, index))
        if address is None:
            return None
        raw = self.name_resolve.get(self._key(keys.worker_info_key, role, index))
        info = json.loads(raw) if raw else {}
        worker = Worker.from_registration(role, index, address, info)
        worker.backend_id = worker.backend_id or self.launcher.backend_id(role, index)
        return worker

    def _failure(
        self, worker_id: str, exit_: WorkerExit, role: str, index: int, when: str
    ) -> WorkerFailedError:
        log_path = exit_.log_path or replica_log_path(str(self.log_dir), role, index)
        time.sleep(0.05)
        return WorkerFailedError(
            worker_id,
            exit_.exit_code,
            tail(log_path),
            reason=f"{exit_.reason} {when}",
            log_path=log_path,
        )

    def _rendezvous(self, role: str, workers: list[Worker], only: list[int] | None = None) -> None:
        """Give each worker its torch.distributed variables (``only``: just these ranks)."""
        master = self.launcher.rendezvous_master(role, workers)
        hosts: dict[str, int] = {}
        envs = []
        for rank, worker in enumerate(workers):
            local_rank = hosts.get(worker.host, 0)
            hosts[worker.host] = local_rank + 1
            env = {
                "RANK": str(rank),
                "WORLD_SIZE": str(len(workers)),
                "LOCAL_RANK": str(local_rank),
            }
            if master is not None:
                env.update(MASTER_ADDR=master[0], MASTER_PORT=str(master[1]))
            envs.append(env)
        pairs = list(zip(workers, envs, strict=True))
        if only is not None:
            pairs = [pairs[i] for i in only]

        async def set_all() -> None:
            try:
                await asyncio.gather(
                    *(self._arequest(w, "/set_env", {"env": env}) for w, env in pairs)
                )
            finally:
                self._async_client.forget_all()

        self._io.run(set_all())

    # -------------------------------------------------------------- fork
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
        self._ensure_lease()
        targets = self._roles[target_role].workers
        self.name_resolve.clear_subtree(self._key(keys.role_prefix, job.role))
        self.progress(f"forking {len(targets)} {job.role} worker(s) next to {target_role}")
        state = RoleState(job, [], "forked", target_role)
        self._roles[job.role] = state

        def fork_one(index: int) -> Worker:
            target = targets[index]
            env = {k: v for k, v in job.tasks[index].env_vars.items()}
            made = self.launcher.fork(job.role, target, index, env, command)
            if made is not None:
                return made
            reply = self._request(
                target,
                "/fork",
                {
                    "role": job.role,
                    "index": index,
                    "module": command,
                    "env": env,
                    "timeout": self.startup_timeout,
                },
                timeout=self.startup_timeout + 5,
            )
            return Worker.from_registration(
                job.role,
                index,
                reply["address"],
                reply,
                host=reply.get("host", target.host),
                backend_id=target.backend_id,
                forked=True,
            )

        try:
            state.workers = self._fan_out(fork_one, list(range(len(targets))))
            self._rendezvous(job.role, state.workers)
        except BaseException:
            self._delete_role(job.role)
            raise
        for w in state.workers:
            self._ids[w.id] = w
        return [w.id for w in state.workers]

    # -------------------------------------------------------------- lookup
    def get_workers(self, role: str, timeout: float | None = None) -> list[Worker]:
        """The role's workers once ready; raises WorkerFailedError if one has died.

        Workers made by ``create_workers`` are ready when it returns; those launched with
        ``wait=False`` are waited for here, for ``timeout`` seconds (None: the scheduler's
        ``startup_timeout``), then WorkerTimeoutError (the role stays, call again or
        delete it)."""
        state = self._roles.get(role)
        if state is None:
            known = ", ".join(self._roles) or "none"
            raise WorkerNotFoundError(role, f"no role {role!r} (roles: {known})")
        opts.check_number("timeout", timeout)
        if state.kind == "reused":
            self._finish_role(state.target, self.startup_timeout if timeout is None else timeout)
            state.workers = list(self._roles[state.target].workers)
        with self._lock:
            self._finish_role(role, self.startup_timeout if timeout is None else timeout)
        self._raise_if_dead(state)
        return list(state.workers)

    def _owner_role(self, state: RoleState) -> RoleState:
        return self._roles.get(state.target, state) if state.kind == "reused" else state

    def _raise_if_dead(self, state: RoleState) -> None:
        owner = self._owner_role(state)
        if owner.kind == "launched":
            dead = self.launcher.poll(owner.job.role)
            if dead:
                index, exit_ = sorted(dead.items())[0]
                raise self._failure(f"{owner.job.role}/{index}", exit_, owner.job.role, index, "")

    def _worker(self, worker_id: str) -> Worker:
        why = self._unrestartable.get(worker_id)
        if why is not None:
            raise WorkerFailedError(worker_id, reason=f"died and could not be restarted: {why}")
        worker = self._ids.get(worker_id)
        if worker is None:
            role = str(worker_id).rpartition("/")[0]
            state = self._roles.get(role)
            if state is not None and state.pending:
                with self._lock:
                    self._finish_role(role, self.startup_timeout)
                worker = self._ids.get(worker_id)
        if worker is None:
            raise WorkerNotFoundError(
                worker_id,
                f"no worker {worker_id!r}; known roles: {', '.join(self._roles) or 'none'}",
            )
        return worker

    def _diagnose(self, worker: Worker, cause: BaseException) -> SchedulerError | None:
        """After a broken connection: within about a second, tell a dead worker (an error
        to raise) from a live one that answers again (None: the call may be retried)."""
        state = self._roles.get(worker.role)
        owner_role = state.target if state is not None and state.kind != "launched" else worker.role
        index = worker.index
        deadline = time.monotonic() + DEAD_CHECK_SECONDS
        while True:
            dead = self.launcher.poll(owner_role) if owner_role in self._roles else {}
            if index not in dead and owner_role != worker.role:
                own = self.launcher.poll(worker.role)
                if index in own:
                    return self._failure(worker.id, own[index], worker.role, index, "during a call")
            if index in dead:
                kind = (
                    ""
                    if owner_role == worker.role
                    else f" (its host worker {owner_role}/{index} died)"
                )
                failure = self._failure(
                    worker.id, dead[index], worker.role, index, "during a call" + kind
                )
                self._maybe_restart(worker, failure)
                return failure
            try:
                self._client.request(
                    worker.address, "/health", method="GET", timeout=0.3, identity=worker.identity
                )
                return None
            except (OSError, TimeoutError, SchedulerError, CorralError):
                pass
            if time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        log_path = replica_log_path(str(self.log_dir), worker.role, worker.index)
        return WorkerConnectionError(
            f"worker {worker.id} at {worker.address} does not answer ({cause}) although the "
            f"{self.backend} backend does not report it dead; see {log_path}"
        )

    # -------------------------------------------------------------- restarts
    def set_restart_hook(self, role: str, hook: Callable[[Scheduler, str], Any]) -> None:
        """Call ``hook(scheduler, worker_id)`` after a worker of ``role`` was restarted
        (``SchedulingSpec.max_restarts > 0``), e.g. to create its engines again."""
        self._restart_hooks[role] = hook

    def _maybe_restart(self, worker: Worker, failure: WorkerFailedError) -> None:
        state = self._roles.get(worker.role)
        if state is None or state.kind != "launched":
            return
        spec = state.job.tasks[worker.index]
        done = state.restarts.get(worker.index, 0)
        if done >= spec.max_restarts:
            return
        state.restarts[worker.index] = done + 1
        with self._lock:
            self.name_resolve.delete(self._key(keys.worker_address_key, worker.role, worker.index))
            env = self.worker_env(worker.role, worker.index, spec)
            try:
                self.launcher.restart(worker.role, worker.index, env)
                new = self._await_one(worker.role, worker.index, self.startup_timeout)
            except CorralError as exc:
                # later calls get this, not a misleading connection error
                self._unrestartable[worker.id] = str(exc)
                failure.args = (failure.args[0] + f"\nrestarting it failed: {exc}",)
                return
            state.workers[worker.index] = new
            self._ids[new.id] = new
            self.monitor.forget(new.id)
            self._rendezvous(worker.role, state.workers, only=[worker.index])
        hook = self._restart_hooks.get(worker.role)
        if hook is not None:
            hook(self, new.id)
        failure.restarted = True
        failure.args = (
            failure.args[0] + f"\nrestarted it ({done + 1} of {spec.max_restarts}); "
            "later calls go to the new process",
        )
        self.progress(f"restarted {worker.id} after: {failure.reason}")

    def _await_one(self, role: str, index: int, timeout: float) -> Worker:
        deadline = time.monotonic() + timeout
        next_reason, last_reason = time.monotonic() + 1.0, None
        while time.monotonic() < deadline:
            worker = self._read_worker(role, index)
            if worker is not None:
                return worker
            dead = self.launcher.poll(role)
            if index in dead:
                raise self._failure(f"{role}/{index}", dead[index], role, index, "while restarting")
            hopeless = self.launcher.hopeless(role)
            if hopeless:
                raise WorkerCreationError(f"restarting {role}/{index} is impossible: {hopeless}")
            if time.monotonic() >= next_reason:
                reason = self.launcher.pending_reason(role)
                if reason and reason != last_reason:
                    self.progress(f"waiting for the restart of {role}/{index}: {reason}")
                    last_reason = reason
                next_reason = time.monotonic() + 1.0
            time.sleep(0.02)
        reason = self.launcher.pending_reason(role)
        raise WorkerTimeoutError(
            f"restarted worker {role}/{index} not ready after {timeout:.0f}s"
            + (f"; backend says: {reason}" if reason else "")
        )

    # -------------------------------------------------------------- calls
    def _request(
        self,
        worker: Worker,
        path: str,
        payload: Any,
        timeout: float | None = None,
        retries: int = 2,
        retry_delay: float = 0.0,
    ) -> Any:
        request_id = new_request_id()
        for attempt in range(retries + 1):
            if attempt and retry_delay:
                time.sleep(retry_delay * 2 ** (attempt - 1))
            try:
                return self._client.request(
                    worker.address,
                    path,
                    payload,
                    timeout=timeout,
                    request_id=request_id,
                    identity=worker.identity,
                )
            except TimeoutError as exc:
                raise _no_answer(worker, path, timeout, exc) from None
            except WorkerUnreachableError as exc:
                self._client.forget(worker.address)
                problem = self._diagnose(worker, exc)
                if problem is not None:
                    raise problem from None
                if attempt == retries:
                    raise _still_broken(worker, path, retries, exc) from None

    async def _arequest(
        self,
        worker: Worker,
        path: str,
        payload: Any,
        timeout: float | None = None,
        retries: int = 2,
        retry_delay: float = 0.0,
    ) -> Any:
        request_id = new_request_id()
        for attempt in range(retries + 1):
            if attempt and retry_delay:
                await asyncio.sleep(retry_delay * 2 ** (attempt - 1))
            try:
                return await self._async_client.request(
                    worker.address,
                    path,
                    payload,
                    timeout=timeout,
                    request_id=request_id,
                    identity=worker.identity,
                )
            except TimeoutError as exc:
                raise _no_answer(worker, path, timeout, exc) from None
            except WorkerUnreachableError as exc:
                self._async_client.forget(worker.address)
                problem = await asyncio.to_thread(self._diagnose, worker, exc)
                if problem is not None:
                    raise problem from None
                if attempt == retries:
                    raise _still_broken(worker, path, retries, exc) from None

    @staticmethod
    def _engine_path(engine: Any) -> str:
        if isinstance(engine, str):
            return engine
        if isinstance(engine, type):
            if engine.__module__ == "__main__":
                raise ConfigError(
                    "engine",
                    engine.__qualname__,
                    "define the engine class in an importable module, not in __main__",
                )
            return f"{engine.__module__}:{engine.__qualname__}"
        raise EngineTypeError(
            "engine",
            engine,
            "Engine must be a string import path 'pkg.module.Class' (or the class itself)",
        )

    async def create_engine(
        self, worker_id: str, engine: Any, engine_name: str | None = None, *args: Any, **kwargs: Any
    ) -> None:
        """Import and construct ``engine`` on the worker under ``engine_name`` (default:
        the worker id). Returns None, as AReaL's schedulers do."""
        worker = self._worker(worker_id)
        payload = {
            "engine": self._engine_path(engine),
            "engine_name": engine_name,
            "args": list(args),
            "kwargs": kwargs,
        }
        name = await self._arequest(worker, "/create_engine", payload, retries=1)
        self._roles[worker.role].engines.setdefault(worker.id, set()).add(name)

    async def set_worker_env(self, worker_id: str, env: dict[str, str]) -> None:
        worker = self._worker(worker_id)
        await self._arequest(worker, "/set_env", {"env": {str(k): str(v) for k, v in env.items()}})

    def configure_worker(
        self,
        worker_id: str,
        config: Any = None,
        role: str | None = None,
        rank: int | None = None,
        _worker: Worker | None = None,
    ) -> None:
        """Send the worker its experiment config, role and rank (``/configure``); done for
        every worker at creation when the scheduler has an ``exp_config``."""
        worker = _worker or self._worker(worker_id)
        self._request(
            worker, "/configure", {"config": config, "role": role or worker.role, "rank": rank}
        )

    def call_engine(
        self,
        worker_id: str,
        method: str,
        engine_name: str | None = None,
        *args: Any,
        rpc_meta: dict[str, Any] | None = None,
        http_timeout: float | None = None,
        max_retries: int | None = None,
        retry_delay: float | None = None,
        **kwargs: Any,
    ) -> Any:
        """Call ``method`` on an engine of the worker and return its result.

        Scheduler options (consumed here, never passed to the method), as in AReaL:
        ``http_timeout`` (seconds to wait for the answer; default none),
        ``max_retries`` (attempts when the connection drops; default 3) and
        ``retry_delay`` (seconds before the second attempt, doubling after; default 0:
        corral retries only once it has checked that the worker is alive).
        A live worker runs the method at most once whatever the attempts; a dead one
        raises WorkerFailedError. ``rpc_meta``: ``timeout`` (used when ``http_timeout`` is
        not given), ``max_retries`` (retries after a dropped connection) and ``keep`` (True, or a byte threshold: arrays/tensors of the result stay on the
        worker and come back as ``corral.Ref``; see docs/data-plane.md).
        """
        worker = self._worker(worker_id)
        call = _CallOptions.resolve(rpc_meta, http_timeout, max_retries, retry_delay)
        payload = {
            "engine_name": engine_name,
            "method": method,
            "args": list(args),
            "kwargs": kwargs,
        }
        if call.keep is not None:
            payload["keep"] = parse_keep(call.keep)
        if call.broadcast is not None:
            payload["broadcast"] = call.broadcast
        started, ok = self._calls.begin(worker.role), False
        try:
            result = self._request(
                worker, "/call", payload, call.timeout, call.retries, call.retry_delay
            )
            ok = True
            return result
        except EngineCallError as exc:
            raise _tag(exc, worker_id, method) from None
        finally:
            self._calls.end(worker.role, started, ok)

    async def async_call_engine(
        self,
        worker_id: str,
        method: str,
        engine_name: str | None = None,
        *args: Any,
        rpc_meta: dict[str, Any] | None = None,
        http_timeout: float | None = None,
        max_retries: int | None = None,
        retry_delay: float | None = None,
        **kwargs: Any,
    ) -> Any:
        """``call_engine`` for coroutines; the same scheduler options."""
        worker = self._worker(worker_id)
        call = _CallOptions.resolve(rpc_meta, http_timeout, max_retries, retry_delay)
        payload = {
            "engine_name": engine_name,
            "method": method,
            "args": list(args),
            "kwargs": kwargs,
        }
        if call.keep is not None:
            payload["keep"] = parse_keep(call.keep)
        if call.broadcast is not None:
            payload["broadcast"] = call.broadcast
        started, ok = self._calls.begin(worker.role), False
        try:
            result = await self._arequest(
                worker, "/call", payload, call.timeout, call.retries, call.retry_delay
            )
            ok = True
            return result
        except EngineCallError as exc:
            raise _tag(exc, worker_id, method) from None
        finally:
            self._calls.end(worker.role, started, ok)

    def health(self, worker_id: str, timeout: float = 5.0) -> dict:
        worker = self._worker(worker_id)
        return self._client.request(
            worker.address, "/health", method="GET", timeout=timeout, identity=worker.identity
        )

    def _fan_out(self, fn: Callable[[Any], Any], items: list) -> list:
        if len(items) <= 1:
            return [fn(x) for x in items]
        try:
            futures = [self._pool.submit(fn, x) for x in items]
        except RuntimeError:  # at interpreter exit the pool takes no work: go one by one
            return [fn(x) for x in items]
        return [f.result() for f in futures]

    # -------------------------------------------------------------- teardown
    def delete_workers(self, role: str | None = None, reverse_order: bool = False) -> None:
        """Destroy engines, then stop the workers of ``role`` (or of every role).

        A role that does not exist is a warning, not an error (as in AReaL).
        ``reverse_order=True`` stops each role's workers from the highest rank down, so
        rank 0 (which usually owns the torch.distributed store) goes last, and the roles
        in the reverse of their creation order."""
        with self._lock:
            if role is not None:
                if role not in self._roles:
                    log.warning("delete_workers: no role %r to delete; nothing done", role)
                    return
                for dependent in [r for r, s in self._roles.items() if s.target == role]:
                    self._delete_role(dependent, reverse_order)
                self._delete_role(role, reverse_order)
            else:
                order = list(self._roles)
                if reverse_order:
                    order.reverse()
                dependents = [r for r in order if self._roles[r].kind != "launched"]
                for name in dependents + [r for r in order if r not in dependents]:
                    self._delete_role(name, reverse_order)
            if not self._roles:
                self._drop_lease()
            self._async_client.prune()

    def _delete_role(self, role: str, reverse_order: bool = False) -> None:
        state = self._roles.pop(role, None)
        if state is None:
            return
        for w in state.workers:
            if state.kind != "reused":
                self._ids.pop(w.id, None)
                self._data.owner_gone(w, f"was deleted with delete_workers({role!r})")
                self._unrestartable.pop(w.id, None)
                self.monitor.forget(w.id)
        if state.kind == "reused":
            return
        if state.kind == "forked":
            self._fan_out(lambda w: self._kill_forked(w, state.target), state.workers)
        elif reverse_order:
            for worker in reversed(state.workers):  # one by one: rank 0 last
                self._io.run(self._retire([worker]))
            self._stop_launched(role, reverse_order=True)
        else:
            self._io.run(self._retire(state.workers))
            self._stop_launched(role)
        try:
            self.name_resolve.clear_subtree(self._key(keys.role_prefix, role))
            for kind in ("_info", "_health"):
                self.name_resolve.clear_subtree(
                    f"{self.experiment_name}/{self.trial_name}/{kind}/{role}"
                )
        except Exception as exc:
            log.warning("could not clear name-resolve entries of %s: %s", role, exc)

    def _destroy_engines_quietly(self, worker: Worker) -> None:
        try:
            self._client.request(worker.address, "/destroy_engines", {}, timeout=5.0)
        except Exception as exc:
            log.debug("destroying engines of %s: %s", worker.id, exc)
        self._client.forget(worker.address)

    async def _retire(self, workers: list[Worker]) -> None:
        """Destroy every worker's engines, then ask each to exit; failures are only logged
        (the backend stops whatever is left)."""

        async def quietly(worker: Worker, path: str, timeout: float) -> None:
            try:
                await self._async_client.request(
                    worker.address, path, {}, timeout=timeout, identity=worker.identity
                )
            except Exception as exc:
                log.debug("%s on %s: %s", path, worker.id, exc)

        try:
            await asyncio.gather(*(quietly(w, "/destroy_engines", 5.0) for w in workers))
            await asyncio.gather(*(quietly(w, "/shutdown", 2.0) for w in workers))
        finally:
            for w in workers:
                self._async_client.forget(w.address)
                self._client.forget(w.address)

    def _kill_forked(self, worker: Worker, target_role: str | None) -> None:
        self._destroy_engines_quietly(worker)
        if self.launcher.kill_fork(worker):
            return
        target = self._roles.get(target_role) if target_role else None
        if target is None or worker.index >= len(target.workers):
            return
        try:
            self._client.request(
                target.workers[worker.index].address,
                "/kill_forked_worker",
                {"worker_id": worker.id},
                timeout=10.0,
            )
        except Exception as exc:
            log.warning("could not stop forked worker %s: %s", worker.id, exc)

    def _stop_launched(self, role: str, reverse_order: bool = False) -> None:
        try:
            if reverse_order:
                self.launcher.stop_in_reverse(role)
            else:
                self.launcher.stop(role)
        except Exception as exc:
            raise SchedulerError(f"stopping the {role} workers failed: {exc}") from exc

    def close(self) -> None:
        """Delete every worker and release the backend. Safe to call twice."""
        if self._closed:
            return
        try:
            self.delete_workers()
        finally:
            self._closed = True
            self._data.close()
            self.monitor.stop()
            self._client.close()
            self._pool.shutdown(wait=False)
            self._io.close()
            self.launcher.close()
            self._remove_secret()
            _live_schedulers.discard(self)

    def __enter__(self) -> Scheduler:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def roles(self) -> list[str]:
        return list(self._roles)


@dataclass(frozen=True)
class _CallOptions:
    """A call's timeout and retry policy from AReaL's keywords and ``rpc_meta``."""

    timeout: float | None
    retries: int
    retry_delay: float
    keep: Any = None
    broadcast: bool | None = None

    @classmethod
    def resolve(
        cls,
        rpc_meta: Any,
        http_timeout: Any,
        max_retries: Any,
        retry_delay: Any,
    ) -> _CallOptions:
        meta = rpc_meta or {}
        if not isinstance(meta, dict):
            raise ConfigError("rpc_meta", rpc_meta, "use a dict or None")
        timeout = http_timeout if http_timeout is not None else meta.get("timeout")
        opts.check_number("http_timeout", timeout)
        if max_retries is not None:
            opts.check_type("max_retries", max_retries, (int,), "a whole number >= 1")
            if max_retries < 1:
                raise ConfigError("max_retries", max_retries, "use a whole number >= 1 (attempts)")
            retries = max_retries - 1
        else:
            retries = int(meta.get("max_retries", 2))
        delay = opts.check_number("retry_delay", retry_delay)
        # No delay by default: a retry follows a check that the worker is alive.
        broadcast = meta.get("broadcast")
        if broadcast is not None and not isinstance(broadcast, bool):
            raise ConfigError(
                "rpc_meta['broadcast']",
                broadcast,
                "use True (every rank of a data-parallel group gets its head's arguments), "
                "False, or leave it out (AReaL's default: True for an initialized TrainEngine)",
            )
        delay = 0.0 if delay is None else delay
        return cls(timeout, retries, delay, meta.get("keep"), broadcast)


def _tag(exc: EngineCallError, worker_id: str, method: str) -> EngineCallError:
    exc.worker_id = exc.worker_id or worker_id
    exc.method = exc.method or method
    return exc


def _no_answer(
    worker: Worker, path: str, timeout: float | None, exc: BaseException
) -> WorkerTimeoutError:
    message = f"worker {worker.id} did not answer {path} within {timeout}s: {exc}"
    return WorkerTimeoutError(worker.id, timeout, message)


def _still_broken(
    worker: Worker, path: str, retries: int, exc: WorkerUnreachableError
) -> WorkerConnectionError:
    return WorkerConnectionError(
        f"the connection to worker {worker.id} broke {retries + 1} time(s) during {path}: "
        f"{exc.cause}; it is alive, so retry or raise rpc_meta['max_retries']"
    )


_live_schedulers: weakref.WeakSet[Scheduler] = weakref.WeakSet()


@atexit.register
def _cleanup_at_exit() -> None:
    """Ctrl-C or a normal exit with workers still up: stop them before the interpreter ends."""
    for scheduler in list(_live_schedulers):
        try:
            scheduler.close()
        except Exception as exc:
            log.warning("cleanup at exit failed: %s", exc)


__all__ = ["Scheduler", "WorkerCreationError"]
