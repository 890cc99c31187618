"""The shared controller: one API over every backend.

A backend contributes only a ``Launcher``. This class wires the pieces that are written
once for all backends and answers the public API with them (its roles and workers in
``corral.role_api``, its engine half in ``corral.engine_api``, both mixins of it):

- ``corral.roles``: the table of roles and workers, and the checks a new role passes;
- ``corral.watch``: waiting for registration, deaths, diagnosis after a broken call;
- ``corral.calls``: every request to a worker (one retry policy, sync and async);
- ``corral.teardown``: retiring roles in order;
- ``corral.lease``: holding the trial (lease, secret, stats file, health monitor);
- ``corral.worker.env``: the environment contract with the worker process;
- ``corral.paths``: where the trial's files are.
"""

from __future__ import annotations

import atexit
import logging
import os
import secrets
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from corral import dispatch as dispatching
from corral.attach import adopt, check_grace, detach, find_run
from corral.calls import Caller
from corral.capabilities import require
from corral.data.plane import DataPlane
from corral.discovery.signed import SignedNameResolve
from corral.engine_api import EngineAPI
from corral.errors import WorkerCreationError, WorkerFailedError
from corral.groups.controller import GroupInfo, GroupPorts, GroupTable
from corral.health import DEFAULT_INTERVAL, HealthMonitor, WorkerHealth, health_key
from corral.ioloop import IOLoop
from corral.launcher import Launcher, WorkerExit
from corral.lease import TrialHold
from corral.observe.publisher import StatsPublisher, make_call_stats
from corral.restarts import restart_if_allowed
from corral.role_api import RoleAPI
from corral.roles import RoleState, RoleTable
from corral.runs import new_run_id
from corral.settings import ControllerSettings, ensure_dir
from corral.spec import Worker
from corral.teardown import Teardown
from corral.watch import Watch
from corral.worker import env as E

log = logging.getLogger("corral")

__all__ = ["Scheduler", "RoleState", "WorkerCreationError"]


class Scheduler(RoleAPI, EngineAPI):
    """One API over every backend. Subclasses pick a ``Launcher``."""

    backend = "base"

    def __init__(
        self,
        exp_config: Any = None,
        *,
        launcher: Launcher,
        lease_timeout: float = E.DEFAULT_LEASE_TIMEOUT,
        progress: Callable[[str], None] | None = None,
        on_worker_death: Callable[[str, WorkerExit], Any] | None = None,
        health_interval: float = DEFAULT_INTERVAL,
        dry_run: bool = False,
        outlive_controller: float = 0.0,
        attach: bool = False,
        **settings: Any,
    ):
        """``settings``: AReaL's keywords (``experiment_name``, ``trial_name``,
        ``fileroot``, ``log_dir``, ``startup_timeout``, ``n_gpus_per_node``,
        ``health_check_interval``, ``enable_tms_offload``, ``name_resolve_type``,
        ``nfs_record_root``, ``etcd3_addr``) and ``name_resolve`` (a store), resolved
        with the config by :class:`corral.settings.ControllerSettings` (an ``exp_config``
        wins over the keywords it also holds, except ``fileroot``).
        ``dry_run=True``: start, connect to and write nothing (no directory, no secret, no
        name-resolve store); ``create_workers`` prints :meth:`dry_run` instead.
        ``outlive_controller`` (seconds) and ``attach``: see corral.attach."""
        try:  # a launcher handed in is this scheduler's: released if it cannot start
            self.dry_run_only = dry_run
            got = ControllerSettings.resolve(exp_config, dry_run=dry_run, **settings)
            self.settings = got
            self.exp_config = got.exp_config
            self.experiment_name, self.trial_name = got.experiment_name, got.trial_name
            self._n_gpus_per_node = got.n_gpus_per_node
            self.startup_timeout = got.startup_timeout
            self.health_check_interval = got.health_check_interval
            self.enable_tms_offload = got.enable_tms_offload
            self.fileroot, self.paths = got.fileroot, got.paths
            #: A pathlib.Path, as in AReaL (``str(sched.log_dir)`` for the text).
            self.log_dir = Path(self.paths.log_dir)
            self.outlive_controller = check_grace(outlive_controller)
            run = None
            if attach:  # continue a run whose controller is gone (same run id and secret)
                run = find_run(
                    got.name_resolve, self.experiment_name, self.trial_name,
                    self.paths.secret_file, lease_timeout,
                )  # fmt: skip
                self.outlive_controller = self.outlive_controller or run.lease.grace
            self.secret = run.secret if run else secrets.token_hex(32)  # file written at claim
            # records are signed with the trial secret; unsigned or forged ones are refused
            self.name_resolve = SignedNameResolve(got.name_resolve, self.secret)
            self.lease_timeout = lease_timeout
            self.launcher = launcher
            self.progress = progress or (lambda text: log.info(text))
            launcher.progress = self.progress
            launcher.trial_secret = self.secret
            if self.outlive_controller:
                require(
                    launcher, "adoption", "keep workers after their controller is gone",
                    "outlive_controller", outlive_controller,
                )  # fmt: skip
            launcher.outlive = self.outlive_controller  # workers outlive the controller (attach)
            self.secret_file = self.paths.secret_file  # written when the run claims its trial
            self.run_id = run.lease.run_id if run else new_run_id()
            self.removed_leftovers: list[str] = []
            self._table = RoleTable()
            self._roles = self._table.roles  # role -> RoleState (read by tests and tools)
            self._lock = threading.RLock()
            self._restart_hooks: dict[str, Callable[[Scheduler, str], Any]] = {}
            # Blocking launcher work (Ray forks) fans out on a few threads; requests to many
            # workers at once (rendezvous, teardown) run as coroutines on one loop thread.
            self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="corral-fanout")
            self._io = IOLoop()
            self._call_stats = make_call_stats()  # per-role call figures for corral dashboard / top
            self._stats = StatsPublisher(self, self._call_stats)
            self._data = DataPlane(
                f"{self.experiment_name}/{self.trial_name}",
                self._table.ids.get,
                lambda w, path, payload, timeout: self._calls.call(w, path, payload, timeout, 0),
                lambda w, path, payload, timeout: self._calls.acall(w, path, payload, timeout, 0),
            )
            self.monitor = HealthMonitor(
                self._table.watched,
                launcher.poll,
                self._record_health,
                self.progress,
                health_interval,
            )
            if on_worker_death is not None:
                self.monitor.callbacks.append(on_worker_death)
            # the trial every piece below serves, named once
            trial = {
                "experiment": self.experiment_name,
                "trial": self.trial_name,
                "name_resolve": self.name_resolve,
            }
            self._hold = TrialHold(
                **trial,
                run_id=self.run_id,
                lease_timeout=lease_timeout,
                grace=self.outlive_controller,
                secret=self.secret,
                secret_file=self.secret_file,
                remove_leftovers=launcher.remove_leftovers,
                stats=self._stats,
                monitor=self.monitor,
                progress=self.progress,
            )
            self._watch = Watch(
                **trial,
                launcher=launcher,
                roles=self._table,
                paths=self.paths,
                backend=self.backend,
                progress=self.progress,
            )
            self._calls = Caller(self.secret, self._watch.diagnose, self._call_stats)
            self._watch.probe = lambda w: self._calls.health(w, 0.3)
            self._watch.on_death = self._maybe_restart
            self._teardown = Teardown(
                **trial,
                launcher=launcher,
                roles=self._table,
                caller=self._calls,
                fan_out=self._fan_out,
                run_async=lambda coro: self._io.run(coro),
                gone=self._worker_gone,
            )
            # the two RL verbs: dispatch over a role, process groups across roles
            ids = lambda role: [w.id for w in self.get_workers(role)]  # noqa: E731
            route = lambda wid, path, body, timeout=None: self._calls.acall(  # noqa: E731
                self._worker(wid), path, body, timeout
            )
            self._dispatch = dispatching.DispatchPorts(
                ids,
                lambda wid, method, engine, args, kwargs, meta: self.async_call_engine(
                    wid, method, engine, *args, rpc_meta=meta, **kwargs
                ),
                route,
            )
            self._groups = GroupTable(GroupPorts(ids, route))
            self._closed = False
        except BaseException:
            launcher.close()
            raise
        _live_schedulers.add(self)
        if run is not None:  # adopted workers outlive a failed attach (see corral.attach)
            self._hold.wrote_secret = True  # the run's secret file is ours to remove at close
            adopt(self, run)

    # ------------------------------------------------------------------ setup
    @property
    def n_gpus_per_node(self) -> int:
        return self._n_gpus_per_node

    @property
    def roles(self) -> list[str]:
        return self._table.names()

    _ensure_dir = staticmethod(ensure_dir)

    @property
    def secrets_dir(self) -> str:
        """``<fileroot>/secrets/<experiment>/<trial>`` (not created here)."""
        return os.path.dirname(self.secret_file)

    def _hold_lease(self) -> None:
        """Claim the trial for this run before anything starts (see corral.lease)."""
        if not self._hold.held:
            self.removed_leftovers = self._hold.hold()

    # ------------------------------------------------------------ health monitor
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
        for ids in self._table.watched().values():
            for worker_id in ids:
                dead = self.monitor.dead.get(worker_id)
                status[worker_id] = f"dead: {dead.reason}" if dead else "alive"
        return status

    def _key(self, fn, *args) -> str:
        return fn(self.experiment_name, self.trial_name, *args)

    # -------------------------------------------------------------- restarts
    def set_restart_hook(self, role: str, hook: Callable[[Scheduler, str], Any]) -> None:
        """Call ``hook(scheduler, worker_id)`` after a worker of ``role`` was restarted
        (``SchedulingSpec.max_restarts > 0``), e.g. to create its engines again."""
        self._restart_hooks[role] = hook

    def _maybe_restart(self, worker: Worker, failure: WorkerFailedError) -> None:
        restart_if_allowed(self, worker, failure)

    def _worker_gone(self, worker: Worker, role: str) -> None:
        """A worker was deleted: the monitor stops watching it, its data refs are lost."""
        self.monitor.forget(worker.id)
        self._data.owner_gone(worker, f"was deleted with delete_workers({role!r})")

    def _worker(self, worker_id: str) -> Worker:
        """The worker by id; a worker of a role launched with ``wait=False`` is waited for."""
        if worker_id not in self._table.ids and worker_id not in self._table.unrestartable:
            state = self._roles.get(str(worker_id).rpartition("/")[0])
            if state is not None and state.pending:
                with self._lock:
                    self._finish_role(state.job.role, self.startup_timeout)
        return self._table.worker(worker_id)

    def _fan_out(self, fn: Callable[[Any], Any], items: list) -> list:
        if len(items) <= 1:
            return [fn(x) for x in items]
        try:
            futures = [self._pool.submit(fn, x) for x in items]
        except RuntimeError:  # at interpreter exit the pool takes no work: go one by one
            return [fn(x) for x in items]
        return [f.result() for f in futures]

    # ------------------------------------------- dispatch and process groups
    def dispatch(
        self,
        role: str,
        method: str,
        engine_name: str | None = None,
        *args: Any,
        mode: str = "split",
        collect: str = "concat",
        rpc_meta: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> Any:
        """Call ``method`` on every worker of ``role``, the arguments split by rank, and
        collect the results in rank order. ``mode``: "split" (lists, arrays, tensors and
        refs, also in dicts, by rows: the first ``n % k`` ranks get one row more), "all",
        "rank0", "engine" (the engine's own DP layout). ``collect``: "concat", "list",
        "refs". See corral.dispatch and docs/data-plane.md, "Dispatch"."""
        dispatching.check(mode, collect, rpc_meta)
        return self._io.run(
            dispatching.dispatch(
                self._dispatch, role, method, engine_name, args, kwargs, mode, collect, rpc_meta
            )
        )

    async def async_dispatch(
        self,
        role: str,
        method: str,
        engine_name: str | None = None,
        *args: Any,
        mode: str = "split",
        collect: str = "concat",
        rpc_meta: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> Any:
        """``dispatch`` for asyncio code: the same modes, results and errors."""
        return await dispatching.dispatch(
            self._dispatch, role, method, engine_name, args, kwargs, mode, collect, rpc_meta
        )

    def create_process_group(
        self, name: str, roles: list[str], backend: str = "gloo", timeout: float = 300.0
    ) -> GroupInfo:
        """A named ``torch.distributed`` group over the workers of ``roles`` (role names
        or worker ids such as "trainer/0"), ranked role by role; engines get it with
        ``corral.groups.process_group(name)``. ``backend``: "gloo" or "nccl" (CUDA
        tensors). A member that does not join within ``timeout`` s: ProcessGroupError
        naming it. See corral.groups and docs/data-plane.md, "Weight sync"."""
        return self._io.run(self._groups.create(name, roles, backend, timeout))

    def destroy_process_group(self, name: str) -> bool:
        """Drop the group on its members; False if no group has that name."""
        return self._io.run(self._groups.destroy(name))

    # -------------------------------------------------------------- teardown
    def delete_workers(self, role: str | None = None, reverse_order: bool = False) -> None:
        """Destroy engines, then stop the workers of ``role`` (or of every role).

        A role that does not exist is a warning, not an error (as in AReaL).
        ``reverse_order=True`` stops each role's workers from the highest rank down, so
        rank 0 (which usually owns the torch.distributed store) goes last, and the roles
        in the reverse of their creation order."""
        with self._lock:
            for name in self._groups.of_roles(role):  # groups go with any role of theirs
                self._io.run(self._groups.destroy(name))
            self._stats.before_delete()  # the final table keeps the deleted roles' rows
            self._teardown.delete(role, reverse_order)
            if not self._roles:
                self._hold.release()
            self._calls.async_client.prune()

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
            self._calls.close()
            self._pool.shutdown(wait=False)
            self._io.close()
            self.launcher.close()
            self._hold.remove_secret()
            _live_schedulers.discard(self)

    def __enter__(self) -> Scheduler:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


_live_schedulers: weakref.WeakSet[Scheduler] = weakref.WeakSet()


@atexit.register
def _cleanup_at_exit() -> None:
    """Ctrl-C or a normal exit with workers still up: stop them before the interpreter ends."""
    for scheduler in list(_live_schedulers):
        try:
            if scheduler.outlive_controller and scheduler._roles:
                detach(scheduler)  # opt-in: the workers wait for a new controller
                continue
            scheduler.close()
        except Exception as exc:
            log.warning("cleanup at exit failed: %s", exc)
