"""Preemption warnings on Ray: engines hear ``on_preempt`` when Ray drains their node.

Ray 2.x drains a node before it goes away when someone asks the GCS to (the autoscaler
for idle or preempted instances, KubeRay, ``ray drain-node --reason
DRAIN_NODE_REASON_PREEMPTION --deadline-remaining-seconds N``; all call
``GcsClient.drain_node``). The GCS then lists the node with its deadline in
``GcsClient.get_draining_nodes()`` (node id -> deadline in ms since the epoch, 0: none)
until it is gone, while its actors keep running. The driver asks for that list at most
once a second (from the health monitor's polls) and, the first time a node that hosts a
live replica shows up, calls the replica's actor ``preempt_warning(reason)``, which runs
``on_preempt(reason)`` on each of its engines (the hook Slurm's SIGTERM/``--signal`` calls).

Both calls are Ray developer APIs (the GCS client of the driver's runtime), not covered
by Ray's stability guarantees: if they are missing or fail, no warning is given and node
loss is reported as before (``requeue=True``: ``WorkerPreemptedError``). A node that dies
without a drain (a hardware fault, a spot instance reclaimed without notice reaching Ray)
gives no warning at all.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from corral.backends.ray.private_api import draining_nodes

ASK_INTERVAL_SECONDS = 1.0


def drain_reason(node_id: str, deadline_ms: int) -> str:
    if deadline_ms:
        left = max(0.0, deadline_ms / 1000.0 - time.time())
        when = f"it will be killed in about {left:.0f}s"
    else:
        when = "no deadline given"
    return f"Ray is draining node {node_id[:12]} ({when})"


class DrainWarnings:
    """Which replicas were warned that Ray drains their node (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._asked = 0.0
        self._draining: dict[str, int] = {}
        self._warned: set[str] = set()  # actor names
        self.unavailable: str | None = None
        """Why Ray's draining list cannot be read (then no warnings are given)."""

    def draining(self) -> dict[str, int]:
        with self._lock:
            if time.monotonic() - self._asked < ASK_INTERVAL_SECONDS:
                return dict(self._draining)
            self._asked = time.monotonic()
        try:
            found = draining_nodes()
            self.unavailable = None
        except Exception as exc:  # a developer API: absent or failing means no warnings
            found = {}
            self.unavailable = f"{type(exc).__name__}: {exc}"
        with self._lock:
            self._draining = found
        return dict(found)

    def warn(self, replicas: list[tuple[str, str, Any]]) -> list[str]:
        """``replicas``: (actor name, node id, actor handle) of live replicas. Sends the
        warning once per replica whose node is draining; returns the names warned now."""
        draining = self.draining()
        if not draining:
            return []
        warned = []
        for name, node_id, actor in replicas:
            if node_id not in draining:
                continue
            with self._lock:
                if name in self._warned:
                    continue
                self._warned.add(name)
            try:
                actor.preempt_warning.remote(drain_reason(node_id, draining[node_id]))
                warned.append(name)
            except Exception:
                pass
        return warned
