"""What a controller is wired from, held by one object.

``Scheduler`` (corral.controller.scheduler) is the public face; :class:`ControllerParts`
is its state. Every feature of the controller (launching roles, calls, scaling,
preemption, restarts, re-attaching, dry runs, teardown) is a function or a small class
that receives this object, reads and changes its public fields, and never imports
``Scheduler``. ``corral.controller.wiring.wire`` builds it.

Tools, tests and benchmarks may read it as ``sched.parts`` (e.g. ``sched.parts.caller``
for the call path's clients); it is not a stable API.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from corral.controller.caller import Caller
from corral.controller.dispatch import DispatchPorts
from corral.controller.health_monitor import HealthMonitor
from corral.controller.role_table import RoleTable
from corral.controller.settings import ControllerSettings
from corral.controller.teardown import Teardown
from corral.controller.trial_hold import TrialHold
from corral.controller.worker_watch import WorkerWatch
from corral.data.plane import DataPlane
from corral.discovery.signed import SignedNameResolve
from corral.groups.controller import GroupTable
from corral.ioloop import IOLoop
from corral.launcher import Launcher
from corral.observe.publisher import StatsPublisher
from corral.paths import TrialPaths

#: ``hook(worker_id)``: run after a worker of a role came back (restart, preemption);
#: ``Scheduler.set_restart_hook`` binds the user's ``hook(scheduler, worker_id)``.
RestartHook = Callable[[str], Any]


@dataclass(kw_only=True, eq=False)
class ControllerParts:
    # ---- the trial, named once
    settings: ControllerSettings
    backend: str
    experiment: str
    trial: str
    paths: TrialPaths
    run_id: str
    secret: str
    secret_file: str
    name_resolve: SignedNameResolve
    """Every record signed with the trial secret; unsigned or forged ones are refused."""
    lease_timeout: float
    outlive: float
    """Seconds the workers outlive their controller (0: they exit with it)."""
    progress: Callable[[str], None]
    n_gpus_per_node: int
    """GPUs of a node, as the checks count them: the settings' figure, or the backend's
    own (LocalScheduler: its devices, as in AReaL)."""
    dry_run: bool
    """Start, connect to and write nothing; ``create_workers`` prints the plan."""
    # ---- the backend and the roles
    launcher: Launcher
    table: RoleTable
    lock: threading.RLock
    """Held while roles change (create, scale, restart, delete)."""
    # ---- the machinery, written once for every backend
    io: IOLoop
    """Requests to many workers at once run as coroutines on its one thread."""
    pool: ThreadPoolExecutor
    """Blocking launcher work (forks) fans out on a few threads."""
    caller: Caller
    watch: WorkerWatch
    hold: TrialHold
    data: DataPlane
    stats: StatsPublisher
    monitor: HealthMonitor
    teardown: Teardown
    groups: GroupTable
    dispatch: DispatchPorts
    restart_hooks: dict[str, RestartHook] = field(default_factory=dict)
    removed_leftovers: list[str] = field(default_factory=list)
    """What a dead run of the trial left and this one removed when it claimed it."""
    closed: bool = False

    @property
    def startup_timeout(self) -> float:
        return self.settings.startup_timeout

    @property
    def exp_config(self) -> Any:
        return self.settings.exp_config

    def key(self, fn: Callable[..., str], *args: Any) -> str:
        """A name-resolve key of this trial: ``fn(experiment, trial, *args)``."""
        return fn(self.experiment, self.trial, *args)

    def fan_out(self, fn: Callable[[Any], Any], items: list) -> list:
        """``[fn(x) for x in items]``, on the pool's threads when there are several."""
        if len(items) <= 1:
            return [fn(x) for x in items]
        try:
            futures = [self.pool.submit(fn, x) for x in items]
        except RuntimeError:  # at interpreter exit the pool takes no work: go one by one
            return [fn(x) for x in items]
        return [f.result() for f in futures]
