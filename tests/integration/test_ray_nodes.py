"""corral.backends.ray.raylet without Ray: a refused connection to a node's raylet port
means it died (a listening port or a timeout does not), and teardown's last resort kills
only Ray worker processes, by pid. Real sockets and processes, a stand-in for ray.nodes()."""

from __future__ import annotations

import socket
import subprocess
import time
from types import SimpleNamespace

from corral.backends.ray import raylet
from corral.backends.ray.raylet import RayletProbe, end_orphaned_processes
from corral.procs import pid_alive


def _ray_with(node_id: str, port: int):
    nodes = [{"NodeID": node_id, "NodeManagerAddress": "127.0.0.1", "NodeManagerPort": port}]
    return SimpleNamespace(nodes=lambda: nodes)


def test_a_listening_raylet_is_alive_and_a_refusing_one_is_lost():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    probe = RayletProbe(_ray_with("n1", port))
    assert not probe.lost("n1")
    listener.close()  # the raylet died: its port refuses connections
    probe._asked.clear()  # skip the once-per-0.5 s throttle
    assert probe.lost("n1")
    assert probe.is_known_lost("n1") and probe.where("n1") == f"127.0.0.1:{port}"
    assert not probe.lost("unknown-node")  # no address known: proves nothing


def test_teardown_kills_a_leftover_ray_worker_by_pid_and_nothing_else(monkeypatch):
    monkeypatch.setattr(raylet, "PROCESS_EXIT_WAIT_SECONDS", 0.2)
    ray_worker = subprocess.Popen(["bash", "-c", "exec -a ray::RayWorkerActor sleep 60"])
    other = subprocess.Popen(["sleep", "60"])
    try:
        for _ in range(50):  # until bash has exec'd under the new name
            with open(f"/proc/{ray_worker.pid}/cmdline", "rb") as fh:
                if fh.read().startswith(b"ray::"):
                    break
            time.sleep(0.02)
        assert end_orphaned_processes([ray_worker.pid, other.pid]) == [ray_worker.pid]
        ray_worker.wait(10)
        assert pid_alive(other.pid)
    finally:
        for proc in (ray_worker, other):
            proc.kill()
            proc.wait()
