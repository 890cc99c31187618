"""A Ray node whose raylet died while the node's other processes live on.

Ray notices such a node only when the GCS health checks give up on it (about 15 s by
default); until then its actors are reported alive although Ray can no longer reach,
restart or stop anything there (Ray's own check ends each worker process about a second
after its raylet). Calls then fail with a bare "actor unavailable / socket closed", and
tearing down waits for placement groups whose resources the dead node still appears to
hold.

The driver therefore asks the raylets of the nodes that host live replicas directly: a
TCP connection to a node's ``NodeManagerPort`` (listed by ``ray.nodes()``) that is
*refused* means its raylet is gone. A timeout proves nothing (a slow or partitioned
node) and counts as alive: Ray's health checks decide those. Each node is asked at most
every ``PROBE_INTERVAL_SECONDS``.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from typing import Any

from corral.procs import pid_alive

PROBE_INTERVAL_SECONDS = 0.5
CONNECT_TIMEOUT_SECONDS = 0.25
PROCESS_EXIT_WAIT_SECONDS = 3.0
"""How long teardown leaves Ray's own raylet-death check to end a worker process on
this host before corral SIGKILLs it by pid."""


def raylet_lost_reason(name: str, node_id: str, where: str) -> str:
    return (
        f"Ray actor {name} lost its node's raylet (node {node_id[:12]}, raylet at {where} "
        "refuses connections): Ray can no longer reach, restart or stop actors on that node, "
        "and ends their processes itself; Ray marks the node dead only when its health "
        "checks give up (about 15 s). Restart the raylet (ray stop; ray start) or replace "
        "the node"
    )


class RayletProbe:
    """Which nodes' raylets are gone (see the module docstring)."""

    def __init__(self, ray: Any):
        self.ray = ray
        self._lock = threading.Lock()
        self._where: dict[str, tuple[str, int]] = {}
        self._asked: dict[str, float] = {}
        self._lost: set[str] = set()

    def _address(self, node_id: str) -> tuple[str, int] | None:
        with self._lock:
            if node_id in self._where:
                return self._where[node_id]
        try:
            nodes = self.ray.nodes()
        except Exception:
            return None
        with self._lock:
            for node in nodes:
                port = node.get("NodeManagerPort")
                if node.get("NodeID") and node.get("NodeManagerAddress") and port:
                    self._where[node["NodeID"]] = (node["NodeManagerAddress"], int(port))
            return self._where.get(node_id)

    def where(self, node_id: str) -> str:
        address = self._address(node_id)
        return f"{address[0]}:{address[1]}" if address else "an unknown address"

    def lost(self, node_id: str) -> bool:
        """True once the raylet of ``node_id`` refused a connection (then for good: a
        raylet that comes back is a new node with a new id)."""
        with self._lock:
            if node_id in self._lost:
                return True
            now = time.monotonic()
            if now - self._asked.get(node_id, -1e9) < PROBE_INTERVAL_SECONDS:
                return False
            self._asked[node_id] = now
        address = self._address(node_id)
        if address is None:
            return False
        try:
            socket.create_connection(address, timeout=CONNECT_TIMEOUT_SECONDS).close()
            return False
        except ConnectionRefusedError:
            with self._lock:
                self._lost.add(node_id)
            return True
        except OSError:
            return False  # a timeout or an unreachable network proves nothing

    def is_known_lost(self, node_id: str | None) -> bool:
        with self._lock:
            return bool(node_id) and node_id in self._lost


def end_orphaned_processes(pids: list[int]) -> list[int]:
    """Worker processes on this host whose raylet died: Ray's own check ends them within
    about a second; whatever is still there after ``PROCESS_EXIT_WAIT_SECONDS`` is
    SIGKILLed by pid (only a Ray worker process: its command line says so). Returns the
    pids that were killed."""
    deadline = time.monotonic() + PROCESS_EXIT_WAIT_SECONDS
    left = [p for p in pids if pid_alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in left if pid_alive(p)]
    killed = []
    for pid in left:
        if _is_ray_worker(pid):
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
    return killed


def _is_ray_worker(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = fh.read().split(b"\0")
    except OSError:
        return False
    return bool(argv) and (argv[0].startswith(b"ray::") or b"default_worker.py" in b" ".join(argv))
