"""Ray workers that outlive their controller (``outlive_controller``, corral.attach).

Such workers are detached actors named ``<prefix>:<role>:<index>`` in the ``corral``
namespace, on placement groups created with ``lifetime="detached"``: both survive the
driver. A new controller made with ``attach=True`` on the same Ray cluster finds each
actor by name, reads its placement group from the actor, and from then on polls, stops
and removes them like its own.

Who removes what when no controller comes back: a detached worker that ends by itself
(its grace period ran out, or ``corral stop`` asked it to exit) ends its process and
removes its own placement group (see ``RayWorkerActor._end``); whatever is left
after a crash (an actor killed from outside, a group whose owner died first) is removed
by the next run or attach of the same trial (``remove_leftovers``).
"""

from __future__ import annotations

from typing import Any

from corral.backends.ray.private_api import group_by_id
from corral.backends.ray.state import NAMESPACE, RayState, Replica, RoleRecord
from corral.capabilities import Adoptable
from corral.errors import ConfigError, SchedulerError
from corral.spec import SchedulingSpec

INFO_TIMEOUT_SECONDS = 30


class RayAdoption(Adoptable):
    """The launcher's ``adoption`` part: reads ``outlive`` and ``own_cluster`` from the
    state, adds the adopted roles to its role table."""

    def __init__(self, state: RayState):
        self.state = state

    def check_outlive(self) -> None:
        """Workers can only outlive this controller on a cluster that outlives it."""
        if self.state.outlive and self.state.own_cluster:
            raise ConfigError(
                "outlive_controller",
                self.state.outlive,
                "the Ray runtime was started by this process and ends with it, and its "
                "workers with it; join a running cluster (address=..., RAY_ADDRESS, or "
                "`ray start --head` on this machine), or use 0",
            )

    def adopt(self, role: str, workers: list, log_dir: str) -> None:
        """The detached actors of a dead controller's run, by name, and their groups."""
        ray = self.state.ray
        record = RoleRecord()
        named = [
            a["name"]
            for a in ray.util.list_named_actors(all_namespaces=True)
            if a.get("namespace") == NAMESPACE
        ]
        for worker in workers:
            tail = f":{role}:{worker.index}"
            try:
                actor, name, info = _actor_with_id(
                    ray, [n for n in named if n.endswith(tail)], worker
                )
            except Exception as exc:
                raise SchedulerError(
                    f"cannot adopt {worker.id}: no live Ray actor with id {worker.backend_id} "
                    f"named ...{tail} in namespace {NAMESPACE!r} on this Ray cluster "
                    f"({type(exc).__name__}: {exc}); attach on the cluster the run used "
                    "(address=... or RAY_ADDRESS)"
                ) from None
            pg = group_by_id(info["pg_id"])
            if all(pg.id != known.id for known in record.pgs):
                record.pgs.append(pg)
                record.bundles.append([])
            replica = Replica(
                role=role, index=worker.index, name=name, actor=actor,
                done_ref=actor.wait_forever.remote(), info_ref=actor.info.remote(),
                env={}, pg=pg, bundle_index=info.get("bundle_index") or 0,
                spec=SchedulingSpec(), kind=None, log_dir=log_dir, info=info,
            )  # fmt: skip
            record.replicas.append(replica)
        with self.state.lock:
            self.state.roles[role] = record


def _actor_with_id(ray: Any, names: list[str], worker: Any) -> tuple[Any, str, dict]:
    """The named actor (of these names) whose id the worker registered, with what it
    reports about itself (its id among it: an actor handle does not show its id)."""
    problem = ""
    for name in names:
        try:
            actor = ray.get_actor(name, namespace=NAMESPACE)
            info = ray.get(actor.info.remote(), timeout=INFO_TIMEOUT_SECONDS)
        except Exception as exc:  # another trial's actor of that role may be gone
            problem = f"; {name}: {type(exc).__name__}: {exc}"
            continue
        if info.get("actor_id") == worker.backend_id:
            return actor, name, info
    raise LookupError(f"{len(names)} actor(s) of that name, none with that id{problem}")
