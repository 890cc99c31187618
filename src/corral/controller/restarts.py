"""Restarting a dead worker (``SchedulingSpec.max_restarts``): the backend starts it
again in its old place, it registers, gets its rank variables back, and the role's
restart hook runs (e.g. to create its engines again)."""

from __future__ import annotations

from corral import name_resolve_keys
from corral.controller.launch import worker_env
from corral.controller.parts import ControllerParts
from corral.controller.rendezvous import give_rendezvous
from corral.controller.role_table import LAUNCHED
from corral.errors import CorralError, WorkerFailedError, WorkerPreemptedError
from corral.spec import Worker


def restart_if_allowed(c: ControllerParts, worker: Worker, failure: WorkerFailedError) -> None:
    """Restart ``worker`` if its spec allows another restart; ``failure`` (the error the
    caller gets) then says so, or why the restart failed."""
    state = c.table.roles.get(worker.role)
    if state is None or state.kind != LAUNCHED or isinstance(failure, WorkerPreemptedError):
        return  # a preempted worker comes back with its job (Scheduler.wait_role)
    spec = state.job.tasks[worker.index]
    done = state.restarts.get(worker.index, 0)
    if done >= spec.max_restarts:
        return
    state.restarts[worker.index] = done + 1
    with c.lock:
        c.name_resolve.delete(
            c.key(name_resolve_keys.worker_address_key, worker.role, worker.index)
        )
        env = worker_env(c, worker.role, worker.index, spec)
        try:
            c.launcher.restart(worker.role, worker.index, env)
            new = c.watch.await_one(worker.role, worker.index, c.startup_timeout)
        except CorralError as exc:
            # later calls get this, not a misleading connection error
            c.table.unrestartable[worker.id] = str(exc)
            failure.args = (failure.args[0] + f"\nrestarting it failed: {exc}",)
            return
        state.workers[worker.index] = new
        c.table.add_workers([new])
        c.monitor.forget(new.id)
        give_rendezvous(c, worker.role, state.workers, only=[worker.index])
    hook = c.restart_hooks.get(worker.role)
    if hook is not None:
        hook(new.id)
    failure.restarted = True
    failure.args = (
        failure.args[0] + f"\nrestarted it ({done + 1} of {spec.max_restarts}); "
        "later calls go to the new process",
    )
    c.progress(f"restarted {worker.id} after: {failure.reason}")
