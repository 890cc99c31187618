"""What the Ray driver learns about the nodes of live replicas on each health poll:
a drained node (its engines get ``on_preempt``: corral.backends.ray.drain) and a dead
raylet (the replica is reported dead at once, naming it: corral.backends.ray.raylet).
The poll and the teardown only call ``check``, ``lost`` and ``end_orphans``."""

from __future__ import annotations

import socket
from typing import Any

from corral.backends.ray.drain import DrainWarnings
from corral.backends.ray.raylet import RayletProbe, end_orphaned_processes, raylet_lost_reason
from corral.launcher import WorkerExit
from corral.logs import replica_log_path


class NodeWatch:
    def __init__(self, ray: Any):
        self.ray = ray
        self.raylets = RayletProbe(ray)
        self.drains = DrainWarnings()

    def node_of(self, replica: Any) -> str | None:
        """The node id the replica's actor runs on (None while it is not up)."""
        if replica.info is None:
            try:
                ready, _ = self.ray.wait([replica.info_ref], timeout=0)
                if not ready:
                    return None
                replica.info = self.ray.get(replica.info_ref, timeout=1)
            except Exception:
                return None
        return (replica.info or {}).get("node_id")

    def check(self, live: list[Any]) -> dict[int, WorkerExit]:
        """Warn replicas on draining nodes; return the exits of those whose raylet died
        (by position in ``live``)."""
        placed = [(i, r, self.node_of(r)) for i, r in enumerate(live)]
        placed = [(i, r, n) for i, r, n in placed if n]
        self.drains.warn([(r.name, n, r.actor) for _, r, n in placed])
        lost: dict[int, WorkerExit] = {}
        for i, r, node in placed:
            if self.raylets.lost(node):
                reason = raylet_lost_reason(r.name, node, self.raylets.where(node))
                log_path = replica_log_path(r.log_dir, r.role, r.index)
                lost[i] = WorkerExit(reason, None, log_path)
        return lost

    def lost(self, replica: Any) -> bool:
        """Was the replica's raylet seen dead? (Ray can neither stop nor ping it then.)"""
        return self.raylets.is_known_lost((replica.info or {}).get("node_id"))

    def end_orphans(self, replicas: list[Any]) -> list[int]:
        """SIGKILL what Ray's own raylet-death check left of these replicas on this host."""
        pids = [
            r.info["pid"]
            for r in replicas
            if r.info and r.info.get("hostname") == socket.gethostname() and r.info.get("pid")
        ]
        return end_orphaned_processes(pids) if pids else []
