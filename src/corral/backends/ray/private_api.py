"""The only place the Ray backend uses Ray's private modules (``ray._private``,
``ray._raylet``), each for something Ray 2.x offers no public API for. Each call is
best effort where the caller can do without it; a Ray upgrade that moves one breaks
only this file.

- ``running_cluster_address``: the runtime already running on this machine, found the
  way ``ray.init()`` itself finds it (``ray._private.services``); ``ray.init(address=
  "auto")`` would connect instead of telling us, so the launcher could not choose.
- ``draining_nodes``: the nodes Ray drains, with their deadlines (the driver's GCS
  client); ``ray.nodes()`` tells at most that a node drains, not its deadline, which
  the engines' ``on_preempt`` reason reports (corral.backends.ray.drain).
- ``held_group_resources``: inside an actor, the per-bundle resource names it holds
  (``GPU_group_<bundle>_<pg id>``), the one place its bundle index shows;
  ``get_assigned_resources()`` strips them.
- ``group_by_id``: a placement group handle from its id (adoption, leftovers); the
  public ``get_placement_group`` looks up by name in the caller's namespace only.
"""

from __future__ import annotations

from typing import Any


def running_cluster_address() -> str | None:
    """The address of a Ray runtime already running on this machine
    (``/tmp/ray/ray_current_cluster``), or None."""
    try:
        from ray._private import services

        return services.canonicalize_bootstrap_address(None)
    except Exception:
        return None


def draining_nodes() -> dict[str, int]:
    """Node id -> drain deadline (ms since the epoch, 0: none); raises if unavailable."""
    from ray._private.worker import global_worker

    return {str(k): int(v or 0) for k, v in global_worker.gcs_client.get_draining_nodes().items()}


def held_group_resources() -> list[str]:
    """Inside an actor: the names of the resources it holds, per-bundle names included
    (empty if Ray will not say)."""
    try:
        from ray._private.worker import global_worker

        return list(global_worker.core_worker.resource_ids())
    except Exception:
        return []


def group_by_id(pg_id: str) -> Any:
    """A handle on the placement group with this id (hex)."""
    from ray._raylet import PlacementGroupID
    from ray.util.placement_group import PlacementGroup

    return PlacementGroup(PlacementGroupID(bytes.fromhex(pg_id)))
