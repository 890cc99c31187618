"""Growing and shrinking a running role on Ray (corral.elastic): new replicas get
placement groups and actors of their own; removed ones take their unused groups along."""

from __future__ import annotations

from corral.backends.ray.actors import ActorStarter
from corral.backends.ray.groups import PlacementGroups
from corral.backends.ray.state import RayState
from corral.backends.ray.teardown import RayTeardown
from corral.capabilities import Elastic
from corral.errors import WorkerCreationError
from corral.launcher import LaunchRequest


class RayElastic(Elastic):
    """The launcher's ``elastic`` part: ``grow`` and ``shrink`` a role of the state's
    role table, with the groups, actors and teardown parts."""

    def __init__(
        self,
        state: RayState,
        groups: PlacementGroups,
        actors: ActorStarter,
        teardown: RayTeardown,
    ):
        self.state = state
        self.groups = groups
        self.actors = actors
        self.teardown = teardown

    def grow(self, request: LaunchRequest, first: int) -> None:
        """New replicas ``first``..: their own placement group(s), waited for whatever the
        strategy (a running role does not wait in a queue), then their actors."""
        from ray.util.placement_group import remove_placement_group

        state = self.state
        record = state.roles[request.job.role]
        kind, _, (pgs, groups, places) = self.groups.create(request, record, first)
        _, pending = state.ray.wait(
            [pg.ready() for pg in pgs], num_returns=len(pgs), timeout=state.startup_timeout
        )
        if pending:
            for pg in pgs:
                remove_placement_group(pg)
            self.groups.wait_gone(pgs)
            raise WorkerCreationError(
                f"could not place {len(places)} more {request.job.role} worker(s) within "
                f"{state.startup_timeout:.0f}s: "
                f"{self.groups.pending_reason(request.job.role) or 'no room'}"
            )
        with state.lock:
            record.pgs.extend(pgs)
            record.bundles.extend(groups)
        self.actors.start_mains(request, record, places, kind, first)

    def shrink(self, role: str, indices: list[int]) -> None:
        """Stop these replicas' actors; remove their placement groups when nothing else
        of the role uses them."""
        gone = set(indices)
        with self.state.lock:
            record = self.state.roles[role]
            doomed = [r for r in record.replicas if r.index in gone]
            record.replicas = [r for r in record.replicas if r.index not in gone]
            used = {id(r.pg) for r in record.replicas}
            keep = [
                (pg, b) for pg, b in zip(record.pgs, record.bundles, strict=True) if id(pg) in used
            ]
            dropped = [pg for pg in record.pgs if id(pg) not in used]
            record.pgs = [pg for pg, _ in keep]
            record.bundles = [b for _, b in keep]
        self.teardown.teardown(doomed, dropped)
