"""Growing and shrinking a running role on Ray (corral.elastic): new replicas get
placement groups and actors of their own; removed ones take their unused groups along."""

from __future__ import annotations

from corral.backends.ray_groups import create_groups, group_specs
from corral.backends.ray_support import name_prefix
from corral.errors import WorkerCreationError
from corral.worker import env as E


class RayElastic:
    """Mixin of RayLauncher: ``grow`` and ``shrink`` (the Elastic capability)."""

    def grow(
        self, role: str, first: int, tasks: list, envs: list[dict[str, str]], log_dir: str
    ) -> None:
        """New replicas ``first``..: their own placement group(s), then their actors."""
        from ray.util.placement_group import remove_placement_group

        with self._lock:
            record = self._roles[role]
        kind = self.accelerator_kind()
        prefix = name_prefix(envs[0][E.EXPERIMENT], envs[0][E.TRIAL])
        bundles = [self._bundle(spec, kind) for spec in tasks]
        pgs, groups, places = create_groups(
            group_specs(prefix, role, bundles, record.strategy, first)
        )
        _, pending = self.ray.wait(
            [pg.ready() for pg in pgs], num_returns=len(pgs), timeout=self.startup_timeout
        )
        if pending:
            for pg in pgs:
                remove_placement_group(pg)
            self._wait_groups_gone(pgs)
            raise WorkerCreationError(
                f"could not place {len(tasks)} more {role} worker(s) within "
                f"{self.startup_timeout:.0f}s: {self.pending_reason(role) or 'no room'}"
            )
        with self._lock:
            record.pgs.extend(pgs)
            record.bundles.extend(groups)
        for i, (spec, env) in enumerate(zip(tasks, envs, strict=True)):
            pg, bundle_index = places[i]
            replica = self._start_main(role, first + i, spec, env, pg, bundle_index, kind, log_dir)
            with self._lock:
                record.replicas.append(replica)

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
