"""Ray node loss as preemption (opt-in: ``RayScheduler(requeue=True)``).

When a Ray node dies, its actors die with it, and Ray places the bundles the node held
again, on another node, as soon as one has room. With ``requeue=True`` a worker whose
actor died *because its node died* is treated like a requeued Slurm job: its exit is
``preempted`` (calls raise ``WorkerPreemptedError``), a new actor is created at once in
the same placement group bundle (Ray starts it when the bundle is placed again), and the
worker stays reported as preempted until the new actor is up. ``Scheduler.wait_role``
then waits for the new generation, re-runs rendezvous and the restart hook. Any other
actor death stays a ``WorkerFailedError`` (restarts, if any, follow ``max_restarts``).
"""

from __future__ import annotations

import re
import threading
import uuid
from typing import Any

from corral.backends.ray.actors import ActorStarter
from corral.backends.ray.state import RayState, Replica
from corral.capabilities import Preemptible
from corral.errors import WorkerCreationError
from corral.launcher import WorkerExit

NODE_LOST = (
    "; its Ray node was lost: a new actor waits for the bundle to be placed again "
    "(Scheduler.wait_role waits for it)"
)
_NODE_DIED = re.compile(r"node (has )?died|node .*(was )?(removed|dead)|NODE_DIED", re.I)


def node_lost(exc: BaseException) -> bool:
    """Did this actor die because its node died (or was drained for preemption)?"""
    return bool(getattr(exc, "preempted", False)) or bool(_NODE_DIED.search(str(exc)))


class NodeLossRequeue(Preemptible):
    """The launcher's ``preemption`` part: which replicas were lost with their node and
    are on their way back (it starts their replacements with the actor starter and puts
    them in the state's role table)."""

    def __init__(self, state: RayState, actors: ActorStarter) -> None:
        self.state = state
        self.actors = actors
        self._lock = threading.Lock()
        self._lost: dict[tuple[str, int], tuple[WorkerExit, Any]] = {}
        """(role, index) -> (the preempted exit, the new replica replacing it)."""
        self._since: set[str] = set()  # roles preempted since mark_returned

    def replace(self, role: str, index: int, exit_: WorkerExit, new: Any) -> WorkerExit:
        with self._lock:
            self._lost[(role, index)] = (exit_, new)
            self._since.add(role)
        return exit_

    def still_lost(self, role: str) -> dict[int, WorkerExit]:
        """The role's replicas whose replacement actor is not up yet."""
        with self._lock:
            mine = {i: v for (r, i), v in self._lost.items() if r == role}
        lost: dict[int, WorkerExit] = {}
        for index, (exit_, new) in mine.items():
            ready, _ = self.state.ray.wait([new.info_ref], num_returns=1, timeout=0)
            if ready:
                with self._lock:
                    self._lost.pop((role, index), None)
            else:
                lost[index] = exit_
        return lost

    def bring_back(self, old: Replica) -> None:
        """A replica lost with its node: a new actor in the same bundle, which Ray starts
        once it placed the bundle again."""
        try:  # a name of its own: Ray may not have released the dead actor's name yet
            new = self.actors.start_main(
                old.role, old.index, old.spec, old.env, old.pg, old.bundle_index, old.kind,
                old.log_dir, suffix=f":back{uuid.uuid4().hex[:6]}",
            )  # fmt: skip
        except WorkerCreationError as exc:
            old.exit.preempted = False
            old.exit.reason += f"; it could not be brought back: {exc}"
            return
        with self.state.lock:
            record = self.state.roles.get(old.role)
            if record is not None:
                record.replicas = [new if r is old else r for r in record.replicas]
        self.replace(old.role, old.index, old.exit, new)

    def preempted(self, role: str) -> bool:
        with self._lock:
            return role in self._since

    def mark_returned(self, role: str) -> None:
        with self._lock:
            self._since.discard(role)

    def forget(self, role: str) -> None:
        with self._lock:
            self._since.discard(role)
            for key in [k for k in self._lost if k[0] == role]:
                del self._lost[key]
