"""The placement groups of the Ray backend: which groups a role asks for, waiting for
them to be placed (or removed), and why a role's workers have not started yet."""

from __future__ import annotations

import logging
import time
from typing import Any

from corral.backends.ray.bundles import accelerator_kind, bundle_of, format_resources
from corral.backends.ray.state import RayState, RoleRecord, name_prefix
from corral.backends.ray.worker_actor import GROUP_RESOURCE_RE
from corral.errors import WorkerCreationError
from corral.launcher import LaunchRequest
from corral.multinode import nodes_of
from corral.spec import NormalizedJob
from corral.worker import env as E

log = logging.getLogger("corral.ray")

GONE_TIMEOUT_SECONDS = 10.0
STRATEGIES = {"separate": "SPREAD", "shared": "PACK", "deferred": "SPREAD"}


def group_specs(
    prefix: str, role: str, bundles: list[dict], strategy: str, first: int = 0
) -> list[tuple[list[dict], str, str]]:
    """``(bundles, strategy, name)`` of each placement group that replicas ``first``..
    of a role ask for: one PACK group for ``shared``, else one group per worker."""
    if strategy == "shared":
        name = f"{prefix}:{role}" + (f":+{first}" if first else "")
        return [(bundles, "PACK", name)]
    return [
        ([b], STRATEGIES[strategy], f"{prefix}:{role}:{first + i}") for i, b in enumerate(bundles)
    ]


def create_groups(
    specs: list[tuple[list[dict], str, str]], detached: bool = False
) -> tuple[list[Any], list[list[dict]], list[tuple[Any, int]]]:
    """The groups of ``group_specs``, their bundles, and each worker's (group, bundle).
    ``detached``: the groups outlive the driver (until removed, see corral.attach)."""
    from ray.util.placement_group import placement_group

    lifetime = {"lifetime": "detached"} if detached else {}
    pgs = [placement_group(b, strategy=s, name=n, **lifetime) for b, s, n in specs]
    groups = [b for b, _, _ in specs]
    places = [(pg, i) for pg, b in zip(pgs, groups, strict=True) for i in range(len(b))]
    return pgs, groups, places


def group_name(pg: Any) -> str:
    from ray.util.placement_group import placement_group_table

    try:
        return placement_group_table(pg).get("name") or pg.id.hex()
    except Exception:
        return pg.id.hex()


class PlacementGroups:
    """A role's groups: creating them, waiting for them (saying what they wait for
    through ``state.progress``) and for their removal."""

    def __init__(self, state: RayState):
        self.state = state

    def nodes_per_worker(self, job: NormalizedJob) -> int:
        """Whole nodes one worker of ``job`` holds (corral.multinode)."""
        return nodes_of(job.tasks[0], self.state.n_gpus_per_node)

    def create(
        self, request: LaunchRequest, record: RoleRecord, first: int = 0, k: int = 1
    ) -> tuple[str | None, list[dict], tuple[list[Any], list[list[dict]], list[tuple[Any, int]]]]:
        """The accelerator kind, each worker's bundle, and the groups created for
        replicas ``first``.. of ``request`` (see create_groups); ``k > 1``: each worker
        holds k whole nodes (one STRICT_SPREAD group of k per-node bundles)."""
        kind = accelerator_kind(self.state.ray)
        env = request.envs[0]
        reserve = self.state.options.reserve_memory
        bundles = [bundle_of(spec, kind, reserve) for spec in request.job.tasks]
        prefix = name_prefix(env[E.EXPERIMENT], env[E.TRIAL])
        if k > 1:  # a multi-node instance: one group of k whole nodes per worker
            specs = [
                ([b] * k, "STRICT_SPREAD", f"{prefix}:{request.job.role}:{first + i}")
                for i, b in enumerate(bundles)
            ]
            return kind, bundles, create_groups(specs, detached=bool(self.state.outlive))
        specs = group_specs(prefix, request.job.role, bundles, record.strategy, first)
        return kind, bundles, create_groups(specs, detached=bool(self.state.outlive))

    def wait_placed(self, job: NormalizedJob, record: RoleRecord, bundles: list[dict]) -> None:
        """Until the role's groups are placed; else remove them, forget the role and raise
        WorkerCreationError saying what was asked and what the cluster has."""
        ray, timeout = self.state.ray, self.state.startup_timeout
        from ray.util.placement_group import remove_placement_group

        refs = {pg.ready(): pg for pg in record.pgs}
        deadline = time.monotonic() + timeout
        pending = list(refs)
        last = None
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=min(left, 1.0))
            if pending:  # waiting for busy resources: say so while it waits
                reason = self.pending_reason(job.role)
                if reason and reason != last:
                    self.state.progress(f"waiting for {job.role}: {reason}")
                    last = reason
        if not pending:
            return
        waiting = [refs[r] for r in pending]
        names = ", ".join(group_name(pg) for pg in waiting[:6])
        if len(waiting) > 6:
            names += f" and {len(waiting) - 6} more"
        total: dict[str, float] = {}
        for b in bundles:
            for key, value in b.items():
                total[key] = total.get(key, 0.0) + value
        uniform = len({str(b) for b in bundles}) == 1
        asked = (
            format_resources(bundles[0]) if uniform else ", ".join(map(format_resources, bundles))
        )
        message = (
            f"could not place {len(waiting)} of {len(record.pgs)} placement group(s) of role "
            f"{job.role!r} within {timeout:.0f}s ({names}): each worker asks "
            f"{asked} (ray_placement_strategy={record.strategy!r}), the role "
            f"{format_resources(total)} in total; the Ray cluster has "
            f"{format_resources(ray.cluster_resources())}, of which "
            f"{format_resources(ray.available_resources())} available. Lower cpu/gpu or "
            "replicas, add nodes, or raise startup_timeout."
        )
        for pg in record.pgs:
            try:
                remove_placement_group(pg)
            except Exception:
                pass
        self.wait_gone(record.pgs)
        with self.state.lock:
            self.state.roles.pop(job.role, None)
        raise WorkerCreationError(message)

    def wait_gone(self, pgs: list[Any], deadline: float | None = None) -> None:
        """Until the groups are REMOVED and their reserved resources are back."""
        if not pgs:
            return
        from ray.util.placement_group import placement_group_table

        deadline = deadline or time.monotonic() + GONE_TIMEOUT_SECONDS
        ids = {pg.id.hex() for pg in pgs}
        while time.monotonic() < deadline:
            states = {placement_group_table(pg).get("state") for pg in pgs}
            held = any(
                GROUP_RESOURCE_RE.search(k) and GROUP_RESOURCE_RE.search(k).group(2) in ids
                for k in self.state.ray.available_resources()
            )
            if states <= {"REMOVED"} and not held:
                return
            time.sleep(0.02)
        log.warning("placement groups %s still present after removal", sorted(ids))

    def pending_reason(self, role: str) -> str | None:
        """Why the role's workers have not started: groups not placed, actors starting."""
        from ray.util.placement_group import placement_group_table

        ray = self.state.ray
        with self.state.lock:
            record = self.state.roles.get(role)
        if record is None or not ray.is_initialized():
            return None
        waiting = []
        for pg, bundles in zip(record.pgs, record.bundles, strict=True):
            state = placement_group_table(pg).get("state", "?")
            if state != "CREATED":
                asked = ", ".join(format_resources(b) for b in bundles)
                waiting.append(f"{group_name(pg)} is {state}, asking {asked}")
        if waiting:
            return (
                "placement group(s) not placed: "
                + "; ".join(waiting[:4])
                + f"; the cluster has {format_resources(ray.available_resources())} "
                f"available of {format_resources(ray.cluster_resources())}"
            )
        starting = [r.name for r in record.replicas if r.exit is None]
        if starting:
            return f"placement groups placed; Ray actors still starting: {', '.join(starting[:4])}"
        return None
