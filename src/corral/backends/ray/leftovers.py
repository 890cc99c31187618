"""A dead controller's run on Ray: its named actors killed and its placement groups
removed (``Launcher.remove_leftovers``, before a new run or attach of the same trial)."""

from __future__ import annotations

import time
from typing import Any

from corral.backends.ray.private_api import group_by_id


def remove_trial_leftovers(ray: Any, prefix: str) -> list[str]:
    """Kill the named actors and remove the placement groups whose names start with
    ``prefix + ':'`` (a dead controller's run); one line per thing removed."""
    from ray.util.placement_group import placement_group_table, remove_placement_group

    removed: list[str] = []
    start = prefix + ":"
    for actor in ray.util.list_named_actors(all_namespaces=True):
        if not actor["name"].startswith(start):
            continue
        try:
            handle = ray.get_actor(actor["name"], namespace=actor.get("namespace"))
            ray.kill(handle, no_restart=True)
            removed.append(f"Ray actor {actor['name']}: killed")
        except Exception:
            continue
    for pg_id, info in placement_group_table().items():
        name = info.get("name") or ""
        if not name.startswith(start) or info.get("state") == "REMOVED":
            continue
        try:
            remove_placement_group(group_by_id(pg_id))
            removed.append(f"Ray placement group {name}: removed")
        except Exception:
            continue
    deadline = time.monotonic() + 10.0  # until the names are free for the new run
    while time.monotonic() < deadline and any(
        a["name"].startswith(start) for a in ray.util.list_named_actors(all_namespaces=True)
    ):
        time.sleep(0.05)
    return removed
