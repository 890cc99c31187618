"""Building a controller: every piece written once for all backends, wired to one
``Launcher`` and one trial, into a :class:`~corral.controller.parts.ControllerParts`.

The pieces call each other through the callbacks set here (a broken call asks the
watch, the watch asks the restart policy, a deleted worker is forgotten by the monitor
and the data plane), so no piece holds another's owner.
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from types import MappingProxyType

from corral.capabilities import require
from corral.controller import engine_calls, launch
from corral.controller.adoption import Attachable, find_run
from corral.controller.caller import Caller
from corral.controller.dispatch import DispatchPorts
from corral.controller.health_monitor import HealthMonitor, WorkerHealth, health_key
from corral.controller.parts import ControllerParts
from corral.controller.restarts import restart_if_allowed
from corral.controller.role_table import RoleTable
from corral.controller.run_lease import new_run_id
from corral.controller.settings import ControllerSettings
from corral.controller.teardown import Teardown
from corral.controller.trial_hold import TrialHold
from corral.controller.worker_watch import WorkerWatch
from corral.data.plane import DataPlane
from corral.discovery.signed import SignedNameResolve
from corral.groups.controller import GroupPorts, GroupTable
from corral.ioloop import IOLoop
from corral.launcher import Launcher
from corral.observe.publisher import StatsPublisher, make_call_stats
from corral.observe.resources import usage_reader
from corral.observe.snapshot import ControllerView
from corral.spec import Worker

log = logging.getLogger("corral")


def wire(
    settings: ControllerSettings,
    *,
    launcher: Launcher,
    backend: str,
    lease_timeout: float,
    progress: Callable[[str], None] | None,
    health_interval: float,
    dry_run: bool,
    outlive: float,
    attach: bool,
) -> tuple[ControllerParts, Attachable | None]:
    """The controller's parts, and the dead run to take over when ``attach`` (then the
    run id, the secret and the grace period are that run's)."""
    experiment, trial, paths = settings.experiment_name, settings.trial_name, settings.paths
    run = None
    if attach:  # continue a run whose controller is gone (same run id and secret)
        run = find_run(settings.name_resolve, experiment, trial, paths.secret_file, lease_timeout)
        outlive = outlive or run.lease.grace
    secret = run.secret if run else secrets.token_hex(32)  # its file is written at claim
    name_resolve = SignedNameResolve(settings.name_resolve, secret)
    progress = progress or (lambda text: log.info(text))
    launcher.progress = progress
    launcher.trial_secret = secret
    if outlive:
        require(
            launcher, "adoption", "keep workers after their controller is gone",
            "outlive_controller", outlive,
        )  # fmt: skip
    launcher.outlive = outlive  # workers outlive the controller (corral.controller.adoption)
    run_id = run.lease.run_id if run else new_run_id()
    table = RoleTable()
    trial_names = {"experiment": experiment, "trial": trial, "name_resolve": name_resolve}
    c: ControllerParts  # set below; the callbacks read it once the controller runs

    monitor = HealthMonitor(
        table.watched,
        launcher.poll,
        lambda role, index, health: record_health(c, role, index, health),
        progress,
        health_interval,
    )
    view = ControllerView(  # what corral dashboard / top are shown
        experiment=experiment,
        trial=trial,
        backend=backend,
        log_dir=paths.log_dir,
        name_resolve=name_resolve,
        roles=MappingProxyType(table.roles),
        deaths=MappingProxyType(monitor.dead),
        poll=lambda role: c.launcher.poll(role),
        pending_reason=lambda role: c.launcher.pending_reason(role),
        usage=usage_reader(settings.name_resolve, secret, experiment, trial),
    )
    call_stats = make_call_stats()  # per-role call figures for corral dashboard / top
    stats = StatsPublisher(view, call_stats, paths.stats_file, paths.metrics_token_file)
    watch = WorkerWatch(
        **trial_names, launcher=launcher, roles=table, paths=paths, backend=backend,
        progress=progress,
    )  # fmt: skip
    caller = Caller(secret, watch.diagnose, call_stats)
    watch.probe = lambda w: caller.health(w, 0.3)
    watch.on_death = lambda worker, failure: restart_if_allowed(c, worker, failure)
    io = IOLoop()
    pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="corral-fanout")
    data = DataPlane(
        f"{experiment}/{trial}",
        table.ids.get,
        lambda w, path, payload, timeout: caller.call(w, path, payload, timeout, 0),
        lambda w, path, payload, timeout: caller.acall(w, path, payload, timeout, 0),
    )
    # the two RL verbs: dispatch over a role, process groups across roles
    route = lambda wid, path, body, timeout=None: caller.acall(  # noqa: E731
        launch.worker(c, wid), path, body, timeout
    )
    ids = lambda role: launch.worker_ids(c, role)  # noqa: E731
    c = ControllerParts(
        settings=settings,
        backend=backend,
        experiment=experiment,
        trial=trial,
        paths=paths,
        run_id=run_id,
        secret=secret,
        secret_file=paths.secret_file,
        name_resolve=name_resolve,
        lease_timeout=lease_timeout,
        outlive=outlive,
        progress=progress,
        n_gpus_per_node=settings.n_gpus_per_node,
        dry_run=dry_run,
        launcher=launcher,
        table=table,
        lock=threading.RLock(),
        io=io,
        pool=pool,
        caller=caller,
        watch=watch,
        hold=TrialHold(
            **trial_names,
            run_id=run_id,
            lease_timeout=lease_timeout,
            grace=outlive,
            secret=secret,
            secret_file=paths.secret_file,
            remove_leftovers=launcher.remove_leftovers,
            stats=stats,
            monitor=monitor,
            progress=progress,
        ),  # fmt: skip
        data=data,
        stats=stats,
        monitor=monitor,
        teardown=Teardown(
            **trial_names,
            launcher=launcher,
            roles=table,
            caller=caller,
            fan_out=lambda fn, items: c.fan_out(fn, items),
            run_async=io.run,
            gone=lambda worker, role: worker_gone(c, worker, role),
        ),  # fmt: skip
        groups=GroupTable(GroupPorts(ids, route)),
        dispatch=DispatchPorts(
            ids,
            lambda wid, method, engine, args, kwargs, meta: engine_calls.async_call_engine(
                c, wid, method, engine, *args, rpc_meta=meta, **kwargs
            ),
            route,
        ),
    )
    return c, run


def record_health(c: ControllerParts, role: str, index: int, health: WorkerHealth) -> None:
    """A death the health monitor found, written where ``corral ps`` reads it."""
    key = health_key(c.experiment, c.trial, role, index)
    c.name_resolve.add(key, health.dump(c.run_id), replace=True)


def worker_gone(c: ControllerParts, worker: Worker, role: str) -> None:
    """A worker was deleted: the monitor stops watching it, its data refs are lost."""
    c.monitor.forget(worker.id)
    c.data.owner_gone(worker, f"was deleted with delete_workers({role!r})")
