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

from corral.controller.parts import ControllerParts
from corral.controller.rendezvous import give_rendezvous
from corral.controller.role_table import LAUNCHED
from corral.errors import WorkerNotFoundError, WorkerTimeoutError


def wait_role(c: ControllerParts, role: str, timeout: float | None = None) -> list[str]:
    state = c.table.roles.get(role)
    if state is None or state.kind != LAUNCHED:
        raise WorkerNotFoundError(f"no launched role {role!r} to wait for")
    timeout = c.startup_timeout if timeout is None else timeout
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
            worker = c.watch.read_worker(role, index)
            if worker is not None and worker.generation != old.get(index):
                back[index] = worker
            elif worker is not None:
                unchanged += 1
        dead = c.launcher.poll(role)
        if len(back) == len(state.workers) and not dead:
            break
        if unchanged == len(state.workers) and not dead and not preempted(c.launcher, role):
            return [w.id for w in state.workers]  # nothing happened to the role
        final = {i: e for i, e in dead.items() if not e.preempted and i not in back}
        if final and not any(e.preempted for e in dead.values()):
            index, exit_ = sorted(final.items())[0]
            raise c.watch.failure(f"{role}/{index}", exit_, role, index, "while coming back")
        now = time.monotonic()
        if now >= deadline:
            reason = c.launcher.pending_reason(role)
            raise WorkerTimeoutError(
                role,
                timeout,
                f"{len(state.workers) - len(back)} {role} worker(s) not back after "
                f"{timeout:.0f}s" + (f"; backend says: {reason}" if reason else ""),
            )
        if now >= next_reason:
            reason = c.launcher.pending_reason(role)
            if reason and reason != last_reason:
                c.progress(f"waiting for {role} to come back: {reason}")
                last_reason = reason
            next_reason = now + 1.0
        time.sleep(0.05)
    with c.lock:
        state.workers = [back[i] for i in range(len(state.workers))]
        for worker in state.workers:
            c.monitor.forget(worker.id)
            c.table.unrestartable.pop(worker.id, None)
        c.table.add_workers(state.workers)
        state.engines.clear()
        if c.launcher.preemption is not None:
            c.launcher.preemption.mark_returned(role)
        give_rendezvous(c, role, state.workers)
    hook = c.restart_hooks.get(role)
    for worker in state.workers:
        if hook is not None:
            hook(worker.id)
    c.progress(f"{role} is back: {len(state.workers)} worker(s), new generation")
    return [w.id for w in state.workers]


def preempted(launcher: object, role: str) -> bool:
    part = getattr(launcher, "preemption", None)
    return part is not None and part.preempted(role)
