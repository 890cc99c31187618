"""Waiting for a preempted role to come back (Slurm ``--requeue``).

When Slurm preempts and requeues a role's job, every call to its workers raises
:class:`~corral.errors.WorkerPreemptedError` (calls do not block or resume by themselves:
an RL loop usually wants to know). ``Scheduler.wait_role(role)`` then waits until Slurm
runs the job again and every replica has registered with a new generation, gives them
their rendezvous variables again, runs the role's restart hook for each (engines are gone
with the old processes: recreate them there, e.g. from a checkpoint written by the
engine's ``on_preempt``), and returns the worker ids (unchanged: ``role/index``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from corral.errors import WorkerNotFoundError, WorkerTimeoutError
from corral.roles import LAUNCHED

if TYPE_CHECKING:
    from corral.scheduler import Scheduler


def wait_role(sched: Scheduler, role: str, timeout: float | None = None) -> list[str]:
    state = sched._roles.get(role)
    if state is None or state.kind != LAUNCHED:
        raise WorkerNotFoundError(f"no launched role {role!r} to wait for")
    timeout = sched.startup_timeout if timeout is None else timeout
    deadline = time.monotonic() + timeout
    old = {w.index: w.generation for w in state.workers}
    back: dict[int, object] = {}
    last_reason = None
    next_reason = time.monotonic() + 1.0
    while True:
        unchanged = 0
        for index in range(len(state.workers)):
            if index in back:
                continue
            worker = sched._watch.read_worker(role, index)
            if worker is not None and worker.generation != old.get(index):
                back[index] = worker
            elif worker is not None:
                unchanged += 1
        dead = sched.launcher.poll(role)
        if len(back) == len(state.workers) and not dead:
            break
        if unchanged == len(state.workers) and not dead and not preempted(sched.launcher, role):
            return [w.id for w in state.workers]  # nothing happened to the role
        final = {i: e for i, e in dead.items() if not e.preempted and i not in back}
        if final and not any(e.preempted for e in dead.values()):
            index, exit_ = sorted(final.items())[0]
            raise sched._watch.failure(f"{role}/{index}", exit_, role, index, "while coming back")
        now = time.monotonic()
        if now >= deadline:
            reason = sched.launcher.pending_reason(role)
            raise WorkerTimeoutError(
                role,
                timeout,
                f"{len(state.workers) - len(back)} {role} worker(s) not back after "
                f"{timeout:.0f}s" + (f"; backend says: {reason}" if reason else ""),
            )
        if now >= next_reason:
            reason = sched.launcher.pending_reason(role)
            if reason and reason != last_reason:
                sched.progress(f"waiting for {role} to come back: {reason}")
                last_reason = reason
            next_reason = now + 1.0
        time.sleep(0.05)
    with sched._lock:
        state.workers = [back[i] for i in range(len(state.workers))]
        for worker in state.workers:
            sched.monitor.forget(worker.id)
            sched._table.unrestartable.pop(worker.id, None)
        sched._table.add_workers(state.workers)
        state.engines.clear()
        if sched.launcher.preemption is not None:
            sched.launcher.preemption.mark_returned(role)
        sched._rendezvous(role, state.workers)
    hook = sched._restart_hooks.get(role)
    for worker in state.workers:
        if hook is not None:
            hook(sched, worker.id)
    sched.progress(f"{role} is back: {len(state.workers)} worker(s), new generation")
    return [w.id for w in state.workers]


def preempted(launcher: object, role: str) -> bool:
    part = getattr(launcher, "preemption", None)
    return part is not None and part.preempted(role)
