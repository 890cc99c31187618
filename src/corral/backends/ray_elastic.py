"""Growing and shrinking a running role on Ray (corral.controller.elastic): new replicas get
placement groups and actors of their own; removed ones take their unused groups along."""

from __future__ import annotations

from corral.errors import WorkerCreationError
from corral.launcher import LaunchRequest


class RayElastic:
    """Mixin of RayLauncher: ``grow`` and ``shrink`` (the Elastic capability)."""

    def grow(self, request: LaunchRequest, first: int) -> None:
        """New replicas ``first``..: their own placement group(s), waited for whatever the
        strategy (a running role does not wait in a queue), then their actors."""
        from ray.util.placement_group import remove_placement_group

        record = self._roles[request.job.role]
        kind, _, (pgs, groups, places) = self._new_groups(request, record, first)
        _, pending = self.ray.wait(
            [pg.ready() for pg in pgs], num_returns=len(pgs), timeout=self.startup_timeout
        )
        if pending:
            for pg in pgs:
                remove_placement_group(pg)
            self._wait_groups_gone(pgs)
            raise WorkerCreationError(
                f"could not place {len(places)} more {request.job.role} worker(s) within "
                f"{self.startup_timeout:.0f}s: "
                f"{self.pending_reason(request.job.role) or 'no room'}"
            )
        with self._lock:
            record.pgs.extend(pgs)
            record.bundles.extend(groups)
        self._start_mains(request, record, places, kind, first)

    def shrink(self, role: str, indices: list[int]) -> None:
        """Stop these replicas' actors; remove their placement groups when nothing else
        of the role uses them."""
        gone = set(indices)
        with self._lock:
            record = self._roles[role]
            doomed = [r for r in record.replicas if r.index in gone]
            record.replicas = [r for r in record.replicas if r.index not in gone]
            used = {id(r.pg) for r in record.replicas}
            keep = [
                (pg, b) for pg, b in zip(record.pgs, record.bundles, strict=True) if id(pg) in used
            ]
            dropped = [pg for pg in record.pgs if id(pg) not in used]
            record.pgs = [pg for pg, _ in keep]
            record.bundles = [b for _, b in keep]
        self._teardown(doomed, dropped)
