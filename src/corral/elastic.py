"""Elastic roles: ``Scheduler.scale(role, replicas)`` grows or shrinks a role at runtime.

Growing starts the new replicas with the next indices (``role/n`` ...), same spec as the
role's last replica, waits until they are ready, then gives *every* worker of the role its
rendezvous variables again (``WORLD_SIZE`` changed; the new ones get the next ranks).
Shrinking removes the highest indices: their engines are destroyed, they are asked to exit
(drain), the backend stops them, and the remaining workers get the new ``WORLD_SIZE``.
A role that others are colocated with or forked from cannot be scaled (delete those first).
The backend part is ``Launcher.grow`` / ``Launcher.shrink``.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING

from corral import name_resolve_keys
from corral.capabilities import require
from corral.errors import ConfigError, WorkerNotFoundError
from corral.fdlimit import ensure_fds
from corral.launcher import LaunchRequest
from corral.roles import LAUNCHED
from corral.spec import NormalizedJob

if TYPE_CHECKING:
    from corral.scheduler import Scheduler


def scale(sched: Scheduler, role: str, replicas: int) -> list[str]:
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise ConfigError(
            "replicas", replicas, "use a whole number >= 1 (delete_workers removes a role)"
        )
    elastic = require(sched.launcher, "elastic", "grow or shrink a role", "role", role)
    with sched._lock:
        state = sched._roles.get(role)
        if state is None:
            raise WorkerNotFoundError(f"no role {role!r} to scale")
        if state.kind != LAUNCHED:
            raise ConfigError("role", role, "only launched roles scale; scale their target instead")
        if state.instances:  # multi-node instances (corral.multinode)
            raise ConfigError(
                "role", role, "multi-node roles do not scale yet; delete and create it again"
            )
        dependents = [r for r, s in sched._roles.items() if s.target == role]
        if dependents:
            raise ConfigError(
                "role", role, f"roles {dependents} are colocated with it; delete them first"
            )
        n = len(state.workers)
        started = time.monotonic()
        if replicas > n:
            tasks = tuple([state.job.tasks[-1]] * (replicas - n))
            envs = [sched.worker_env(role, n + i, spec) for i, spec in enumerate(tasks)]
            ensure_fds(len(tasks) * sched.launcher.fds_per_worker, f"growing {role!r}")
            state.job = dataclasses.replace(
                state.job, replicas=replicas, tasks=state.job.tasks + tasks
            )
            more = NormalizedJob(role, len(tasks), tasks, state.job.strategy)
            elastic.grow(LaunchRequest(more, envs, sched.paths.log_dir), n)
            try:
                workers = sched._watch.await_registration(role, replicas, sched.startup_timeout)
            except BaseException:
                elastic.shrink(role, list(range(n, replicas)))
                state.job = dataclasses.replace(state.job, replicas=n, tasks=state.job.tasks[:n])
                raise
            state.workers = workers
            sched._table.add_workers(workers[n:])
        elif replicas < n:
            doomed = state.workers[replicas:]
            sched._io.run(sched._calls.retire(doomed))  # destroy engines, ask to exit (drain)
            elastic.shrink(role, [w.index for w in doomed])
            for worker in doomed:
                sched._table.ids.pop(worker.id, None)
                sched._table.unrestartable.pop(worker.id, None)
                sched.monitor.forget(worker.id)
                sched._data.owner_gone(worker, f"was removed by scale({role!r}, {replicas})")
                state.engines.pop(worker.id, None)
                for fn in (name_resolve_keys.worker_address_key, name_resolve_keys.worker_info_key):
                    sched.name_resolve.delete(sched._key(fn, role, worker.index))
            state.workers = state.workers[:replicas]
            state.job = dataclasses.replace(
                state.job, replicas=replicas, tasks=state.job.tasks[:replicas]
            )
        else:
            return [w.id for w in state.workers]
        sched._rendezvous(role, state.workers)
        sched.progress(
            f"scaled {role} from {n} to {replicas} worker(s) in {time.monotonic() - started:.2f}s"
        )
        return [w.id for w in state.workers]
