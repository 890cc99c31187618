"""The shared controller: one API over every backend.

A backend contributes only a ``Launcher``. ``Scheduler`` is the table of contents of the
public API: each method hands its work to the feature that does it, passing the
controller's state (:class:`~corral.controller.parts.ControllerParts`, ``sched.parts``,
built by ``corral.controller.wiring``):

- roles: ``create``, ``launch``, ``forking``, ``rendezvous``, ``dryrun``, ``elastic``
  (scale), ``preemption`` (wait_role), ``restarts``, ``adoption`` (attach=True);
- engines: ``engine_calls`` over ``caller`` (the one call path);
- verbs: ``dispatch`` and ``corral.groups`` (process groups);
- the end: ``closing`` over ``teardown``, and ``trial_hold`` (lease, secret, stats).
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import weakref
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from corral.controller import closing, create, elastic, engine_calls, forking, launch
from corral.controller import dispatch as dispatching
from corral.controller.adoption import check_grace, detach, take_over
from corral.controller.dryrun import plan
from corral.controller.health_monitor import DEFAULT_INTERVAL
from corral.controller.parts import ControllerParts
from corral.controller.preemption import wait_role
from corral.controller.role_table import RoleState
from corral.controller.settings import ControllerSettings, ensure_dir
from corral.controller.wiring import wire
from corral.errors import WorkerCreationError
from corral.groups.controller import GroupInfo
from corral.launcher import Launcher, WorkerExit
from corral.multinode import Instance
from corral.spec import SchedulingSpec, Worker, normalize_job
from corral.worker import env as E

log = logging.getLogger("corral")

__all__ = ["Scheduler", "RoleState", "WorkerCreationError"]


class _FromParts:
    """A public attribute of the scheduler that is a field of its parts (read-only
    unless ``settable``)."""

    def __init__(self, path: str, settable: bool = False):
        self.path, self.settable = path.split("."), settable

    def __get__(self, obj: Any, owner: type) -> Any:
        if obj is None:
            return self
        value = obj.parts
        for name in self.path:
            value = getattr(value, name)
        return value

    def __set__(self, obj: Any, value: Any) -> None:
        if not self.settable:
            raise AttributeError(f"{'.'.join(self.path)} is read-only")
        setattr(obj.parts, self.path[0], value)


class Scheduler:
    """One API over every backend. Subclasses pick a ``Launcher``."""

    backend = "base"
    parts: ControllerParts

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
        with the config by :class:`corral.controller.settings.ControllerSettings` (an
        ``exp_config`` wins over the keywords it also holds, except ``fileroot``).
        ``dry_run=True``: start, connect to and write nothing (no directory, no secret, no
        name-resolve store); ``create_workers`` prints :meth:`dry_run` instead.
        ``outlive_controller`` (seconds) and ``attach``: see corral.controller.adoption."""
        try:  # a launcher handed in is this scheduler's: released if it cannot start
            resolved = ControllerSettings.resolve(exp_config, dry_run=dry_run, **settings)
            self.parts, run = wire(
                resolved, launcher=launcher, backend=self.backend, lease_timeout=lease_timeout,
                progress=progress, health_interval=health_interval, dry_run=dry_run,
                outlive=check_grace(outlive_controller), attach=attach,
            )  # fmt: skip
            if on_worker_death is not None:
                self.parts.monitor.callbacks.append(on_worker_death)
        except BaseException:
            launcher.close()
            raise
        _live_schedulers.add(self)
        if run is not None:  # adopted workers outlive a failed attach (see adoption)
            self.parts.hold.wrote_secret = True  # the run's secret file is ours to remove
            take_over(self.parts, run)

    # ------------------------------------------------- what it was set up with
    settings = _FromParts("settings")
    exp_config = _FromParts("exp_config")
    experiment_name = _FromParts("experiment")
    trial_name = _FromParts("trial")
    n_gpus_per_node = _FromParts("n_gpus_per_node", settable=True)
    startup_timeout = _FromParts("startup_timeout")
    health_check_interval = _FromParts("settings.health_check_interval")
    enable_tms_offload = _FromParts("settings.enable_tms_offload")
    fileroot = _FromParts("settings.fileroot")
    paths = _FromParts("paths")
    secret = _FromParts("secret")
    secret_file = _FromParts("secret_file")  # written when the run claims its trial
    name_resolve = _FromParts("name_resolve")
    lease_timeout = _FromParts("lease_timeout")
    outlive_controller = _FromParts("outlive")
    run_id = _FromParts("run_id")
    progress = _FromParts("progress")
    dry_run_only = _FromParts("dry_run")
    launcher = _FromParts("launcher", settable=True)
    monitor = _FromParts("monitor")
    removed_leftovers = _FromParts("removed_leftovers")
    _ensure_dir = staticmethod(ensure_dir)

    @property
    def log_dir(self) -> Path:
        """A pathlib.Path, as in AReaL (``str(sched.log_dir)`` for the text)."""
        return Path(self.parts.paths.log_dir)

    @property
    def secrets_dir(self) -> str:
        """``<fileroot>/secrets/<experiment>/<trial>`` (not created here)."""
        return os.path.dirname(self.parts.secret_file)

    @property
    def roles(self) -> list[str]:
        return self.parts.table.names()

    def role_state(self, role: str) -> RoleState:
        """What the controller knows of ``role`` (kind, job, workers, restarts, engines)."""
        return self.parts.table.state(role)

    # ------------------------------------------------------------------ roles
    def worker_env(self, role: str, index: int, spec: SchedulingSpec) -> dict[str, str]:
        """The environment every backend gives a worker process."""
        return launch.worker_env(self.parts, role, index, spec)

    def create_workers(self, job: Any, *args: Any, wait: bool = True, **kwargs: Any) -> list[str]:
        """Start ``job.replicas`` workers of ``job.role`` and wait until all are ready.

        ``wait=False`` returns once the workers are launched, as AReaL's schedulers do;
        ``get_workers(role, timeout)`` then waits for them (and any call on one of them
        waits up to ``startup_timeout``)."""
        return create.create_workers(self.parts, job, wait)

    def dry_run(self, job: Any) -> str:
        """What ``create_workers(job)`` would ask the backend for, as printable text (the
        local argv and environment, the Ray placement groups and actor options, the
        sbatch script), after the same checks. Starts and writes nothing."""
        return plan(self.parts, normalize_job(job))

    def fork_workers(self, role: str, target_role: str, command: str | None = None) -> list[str]:
        """Start one new worker of ``role`` next to each worker of ``target_role``."""
        return forking.fork_workers(self.parts, role, target_role, command)

    def get_workers(self, role: str, timeout: float | None = None) -> list[Worker]:
        """The role's workers once ready; raises WorkerFailedError if one has died.

        Workers made by ``create_workers`` are ready when it returns; those launched with
        ``wait=False`` are waited for here, for ``timeout`` seconds (None: the scheduler's
        ``startup_timeout``), then WorkerTimeoutError (the role stays, call again or
        delete it)."""
        return launch.get_workers(self.parts, role, timeout)

    def instance(self, worker_id: str) -> Instance:
        """A multi-node worker's instance (docs/shapes.md): its member workers, one per
        node after the first (``create_engine``/``call_engine`` them by id to start the
        server's per-node processes), the node hosts and the head's address; each
        process has CORRAL_NNODES, CORRAL_NODE_RANK, CORRAL_HEAD_ADDR, CORRAL_HEAD_PORT."""
        return launch.instance(self.parts, worker_id)

    def scale(self, role: str, replicas: int) -> list[str]:
        """Grow or shrink a launched role to ``replicas`` workers; see
        corral.controller.elastic."""
        return elastic.scale(self.parts, role, replicas)

    def wait_role(self, role: str, timeout: float | None = None) -> list[str]:
        """After a preemption (WorkerPreemptedError): wait until the backend brought every
        worker of ``role`` back, re-run rendezvous and the restart hook; see
        corral.controller.preemption."""
        return wait_role(self.parts, role, timeout)

    def set_restart_hook(self, role: str, hook: Callable[[Scheduler, str], Any]) -> None:
        """Call ``hook(scheduler, worker_id)`` after a worker of ``role`` was restarted
        (``SchedulingSpec.max_restarts > 0``), e.g. to create its engines again."""
        self.parts.restart_hooks[role] = functools.partial(hook, self)

    # ---------------------------------------------------------------- health
    def on_worker_death(self, callback: Callable[[str, WorkerExit], Any]) -> None:
        """Call ``callback(worker_id, exit)`` from the health monitor's thread when a
        worker is found dead (within ``health_interval`` plus the backend's own delay),
        whether or not a call to it is in flight."""
        self.parts.monitor.callbacks.append(callback)

    def worker_status(self) -> dict[str, str]:
        """``worker_id -> "alive"`` or ``"dead: <reason>"``, as the health monitor knows."""
        return self.parts.monitor.status(self.parts.table.watched())

    def health(self, worker_id: str, timeout: float = 5.0) -> dict:
        return self.parts.caller.health(launch.worker(self.parts, worker_id), timeout)

    # --------------------------------------------------------------- engines
    async def create_engine(
        self, worker_id: str, engine: Any, engine_name: str | None = None, *args: Any, **kwargs: Any
    ) -> None:
        """Import and construct ``engine`` on the worker under ``engine_name`` (default:
        the worker id). Returns None, as AReaL's schedulers do."""
        await engine_calls.create_engine(self.parts, worker_id, engine, engine_name, args, kwargs)

    async def set_worker_env(self, worker_id: str, env: dict[str, str]) -> None:
        await engine_calls.set_worker_env(self.parts, worker_id, env)

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
        engine_calls.configure_worker(self.parts, worker_id, config, role, rank, _worker)

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
        not given), ``max_retries`` (retries after a dropped connection), ``broadcast``
        (the worker first replaces the arguments with its data-parallel head's; default:
        for an initialized TrainEngine; see docs/areal.md) and ``keep``
        (True, or a byte threshold: arrays/tensors of the result stay on the worker and
        come back as ``corral.Ref``; see docs/data-plane.md).
        """
        return engine_calls.call_engine(
            self.parts, worker_id, method, engine_name, args, kwargs,
            (rpc_meta, http_timeout, max_retries, retry_delay),
        )  # fmt: skip

    def async_call_engine(
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
    ) -> Awaitable[Any]:
        """``call_engine`` for asyncio code: the same options, request, retries and errors.
        What it returns is awaited, gathered, or given to ``asyncio.create_task`` /
        ``ensure_future`` / ``wait_for`` / ``asyncio.run`` as a coroutine is; errors are
        raised when it is awaited (``engine_calls.send_async_call_engine``).

        Inside a running loop, with the worker's connection open, the call is sent when
        it is made (like Ray's ``.remote()``) and its future returned: it runs even if
        never awaited (a failure never awaited is logged by asyncio as never retrieved);
        it belongs to that loop (to run a call on another loop, make it there);
        ``asyncio.wait`` refuses it as it refused the coroutine (wrap it in
        ``create_task``). Calls to one worker go in the order made, except those taking
        the coroutine's path (``http_timeout``, a connection not open yet, a large
        body), sent when first awaited. docs/areal.md, "Async calls"."""
        return engine_calls.send_async_call_engine(
            self.parts, worker_id, method, engine_name, args, kwargs,
            (rpc_meta, http_timeout, max_retries, retry_delay),
        )  # fmt: skip

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
        "refs". See corral.controller.dispatch and docs/data-plane.md, "Dispatch"."""
        dispatching.check(mode, collect, rpc_meta)
        return self.parts.io.run(
            dispatching.dispatch(
                self.parts.dispatch,
                role,
                method,
                engine_name,
                args,
                kwargs,
                mode,
                collect,
                rpc_meta,
            )  # fmt: skip
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
            self.parts.dispatch, role, method, engine_name, args, kwargs, mode, collect, rpc_meta
        )

    def create_process_group(
        self, name: str, roles: list[str], backend: str = "gloo", timeout: float = 300.0
    ) -> GroupInfo:
        """A named ``torch.distributed`` group over the workers of ``roles`` (role names
        or worker ids such as "trainer/0"), ranked role by role; engines get it with
        ``corral.groups.process_group(name)``. ``backend``: "gloo" or "nccl" (CUDA
        tensors). A member that does not join within ``timeout`` s: ProcessGroupError
        naming it. See corral.groups and docs/data-plane.md, "Weight sync"."""
        return self.parts.io.run(self.parts.groups.create(name, roles, backend, timeout))

    def destroy_process_group(self, name: str) -> bool:
        """Drop the group on its members; False if no group has that name."""
        return self.parts.io.run(self.parts.groups.destroy(name))

    # -------------------------------------------------------------- teardown
    def delete_workers(self, role: str | None = None, reverse_order: bool = False) -> None:
        """Destroy engines, then stop the workers of ``role`` (or of every role).

        A role that does not exist is a warning, not an error (as in AReaL).
        ``reverse_order=True`` stops each role's workers from the highest rank down, so
        rank 0 (which usually owns the torch.distributed store) goes last, and the roles
        in the reverse of their creation order."""
        closing.delete_workers(self.parts, role, reverse_order)

    def close(self) -> None:
        """Delete every worker and release the backend. Safe to call twice."""
        try:
            closing.close(self.parts)
        finally:
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
            if scheduler.outlive_controller and scheduler.roles:
                detach(scheduler.parts)  # opt-in: the workers wait for a new controller
                continue
            scheduler.close()
        except Exception as exc:
            log.warning("cleanup at exit failed: %s", exc)
