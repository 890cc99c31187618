"""Ray: refuse placements that can never fit.

A bundle fits only if one alive node has at least its resources in *total* (whatever is
busy now), and a role fits only if the cluster's total covers the sum of its bundles.
Anything else would wait in Ray's queue forever (Ray reports such groups as PENDING,
indistinguishable from groups that wait for busy resources), so it is refused at once.
"""

from __future__ import annotations

from typing import Any

IGNORED = ("node:", "object_store_memory", "memory")


def _relevant(resources: dict[str, float]) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in resources.items()
        if "_group_" not in k and not k.startswith(IGNORED)
    }


def node_totals(ray: Any) -> list[dict[str, float]]:
    """The total resources of every alive node."""
    return [_relevant(n.get("Resources", {})) for n in ray.nodes() if n.get("Alive")]


def infeasible(bundles: list[dict[str, float]], nodes: list[dict[str, float]], fmt) -> str | None:
    """Why these bundles can never be placed on these nodes, or None if they can."""
    if not nodes:
        return "the Ray cluster has no alive node"
    for i, bundle in enumerate(bundles):
        need = _relevant(bundle)
        if not any(all(node.get(k, 0.0) >= v for k, v in need.items()) for node in nodes):
            biggest = max(nodes, key=lambda n: sum(n.get(k, 0.0) for k in need))
            return (
                f"worker {i} asks {fmt(need)} but no node has that much in total "
                f"(largest: {fmt(biggest)}; {len(nodes)} node(s))"
            )
    total_need: dict[str, float] = {}
    for bundle in bundles:
        for k, v in _relevant(bundle).items():
            total_need[k] = total_need.get(k, 0.0) + v
    cluster: dict[str, float] = {}
    for node in nodes:
        for k, v in node.items():
            cluster[k] = cluster.get(k, 0.0) + v
    short = {k: v for k, v in total_need.items() if cluster.get(k, 0.0) + 1e-9 < v}
    if short:
        each = (
            f"each worker asks {fmt(_relevant(bundles[0]))}, "
            if len({str(b) for b in bundles}) == 1
            else ""
        )
        return (
            f"{each}the role asks {fmt(total_need)} in total but the whole Ray cluster has "
            f"{fmt(cluster)} ({len(nodes)} node(s))"
        )
    return None
