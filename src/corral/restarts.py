"""Restarting a dead worker (``SchedulingSpec.max_restarts``): the backend starts it
again in its old place, it registers, gets its rank variables back, and the role's
restart hook runs (e.g. to create its engines again)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from corral import name_resolve_keys
from corral.errors import CorralError, WorkerFailedError, WorkerPreemptedError
from corral.roles import LAUNCHED
from corral.spec import Worker

if TYPE_CHECKING:
    from corral.scheduler import Scheduler


def restart_if_allowed(sched: Scheduler, worker: Worker, failure: WorkerFailedError) -> None:
    """Restart ``worker`` if its spec allows another restart; ``failure`` (the error the
    caller gets) then says so, or why the restart failed."""
    state = sched._roles.get(worker.role)
    if state is None or state.kind != LAUNCHED or isinstance(failure, WorkerPreemptedError):
        return  # a preempted worker comes back with its job (Scheduler.wait_role)
    spec = state.job.tasks[worker.index]
    done = state.restarts.get(worker.index, 0)
    if done >= spec.max_restarts:
        return
    state.restarts[worker.index] = done + 1
    with sched._lock:
        sched.name_resolve.delete(
            sched._key(name_resolve_keys.worker_address_key, worker.role, worker.index)
        )
        env = sched.worker_env(worker.role, worker.index, spec)
        try:
            sched.launcher.restart(worker.role, worker.index, env)
            new = sched._watch.await_one(worker.role, worker.index, sched.startup_timeout)
        except CorralError as exc:
            # later calls get this, not a misleading connection error
            sched._table.unrestartable[worker.id] = str(exc)
            failure.args = (failure.args[0] + f"\nrestarting it failed: {exc}",)
            return
        state.workers[worker.index] = new
        sched._table.add_workers([new])
        sched.monitor.forget(new.id)
        sched._rendezvous(worker.role, state.workers, only=[worker.index])
    hook = sched._restart_hooks.get(worker.role)
    if hook is not None:
        hook(sched, new.id)
    failure.restarted = True
    failure.args = (
        failure.args[0] + f"\nrestarted it ({done + 1} of {spec.max_restarts}); "
        "later calls go to the new process",
    )
    sched.progress(f"restarted {worker.id} after: {failure.reason}")
