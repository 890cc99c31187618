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

from corral import name_resolve_keys
from corral.capabilities import require
from corral.controller.launch import worker_env
from corral.controller.parts import ControllerParts
from corral.controller.rendezvous import give_rendezvous
from corral.controller.role_table import LAUNCHED
from corral.errors import ConfigError, WorkerNotFoundError
from corral.fdlimit import ensure_fds
from corral.launcher import LaunchRequest
from corral.spec import NormalizedJob


def scale(c: ControllerParts, role: str, replicas: int) -> list[str]:
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise ConfigError(
            "replicas", replicas, "use a whole number >= 1 (delete_workers removes a role)"
        )
    elastic = require(c.launcher, "elastic", "grow or shrink a role", "role", role)
    with c.lock:
        state = c.table.roles.get(role)
        if state is None:
            raise WorkerNotFoundError(f"no role {role!r} to scale")
        if state.kind != LAUNCHED:
            raise ConfigError("role", role, "only launched roles scale; scale their target instead")
        if state.instances:  # multi-node instances (corral.multinode)
            raise ConfigError(
                "role", role, "multi-node roles do not scale yet; delete and create it again"
            )
        dependents = [r for r, s in c.table.roles.items() if s.target == role]
        if dependents:
            raise ConfigError(
                "role", role, f"roles {dependents} are colocated with it; delete them first"
            )
        n = len(state.workers)
        started = time.monotonic()
        if replicas > n:
            tasks = tuple([state.job.tasks[-1]] * (replicas - n))
            envs = [worker_env(c, role, n + i, spec) for i, spec in enumerate(tasks)]
            ensure_fds(len(tasks) * c.launcher.fds_per_worker, f"growing {role!r}")
            state.job = dataclasses.replace(
                state.job, replicas=replicas, tasks=state.job.tasks + tasks
            )
            more = NormalizedJob(role, len(tasks), tasks, state.job.strategy)
            elastic.grow(LaunchRequest(more, envs, c.paths.log_dir), n)
            try:
                workers = c.watch.await_registration(role, replicas, c.startup_timeout)
            except BaseException:
                elastic.shrink(role, list(range(n, replicas)))
                state.job = dataclasses.replace(state.job, replicas=n, tasks=state.job.tasks[:n])
                raise
            state.workers = workers
            c.table.add_workers(workers[n:])
        elif replicas < n:
            doomed = state.workers[replicas:]
            c.io.run(c.caller.retire(doomed))  # destroy engines, ask to exit (drain)
            elastic.shrink(role, [w.index for w in doomed])
            for worker in doomed:
                c.table.ids.pop(worker.id, None)
                c.table.unrestartable.pop(worker.id, None)
                c.monitor.forget(worker.id)
                c.data.owner_gone(worker, f"was removed by scale({role!r}, {replicas})")
                state.engines.pop(worker.id, None)
                for fn in (name_resolve_keys.worker_address_key, name_resolve_keys.worker_info_key):
                    c.name_resolve.delete(c.key(fn, role, worker.index))
            state.workers = state.workers[:replicas]
            state.job = dataclasses.replace(
                state.job, replicas=replicas, tasks=state.job.tasks[:replicas]
            )
        else:
            return [w.id for w in state.workers]
        give_rendezvous(c, role, state.workers)
        c.progress(
            f"scaled {role} from {n} to {replicas} worker(s) in {time.monotonic() - started:.2f}s"
        )
        return [w.id for w in state.workers]
