"""Ray node faults short of a node's loss (issue 13), timed; used by benchmarks/faults.py.

One extra node joins the tests' cluster (its two nodes are filled by a hog, so workers
land on it). On it: ``close()`` of a healthy one-worker scheduler (the baseline); then a
worker whose node Ray drains for preemption (time until its engine's ``on_preempt``
ran), and whose raylet alone is SIGKILLed (time until a call raises the error naming the
raylet, until the death callback, how long ``close()`` takes, worker processes left).
"""

from __future__ import annotations

import asyncio
import os
import signal
import tempfile
import time

from corral import Job, SchedulingSpec
from corral.errors import WorkerFailedError
from corral.procs import pid_alive

ECHO = "corral.testing.engines.EchoEngine"


def _drain(node_id: str, seconds: int) -> None:
    import ray
    from ray.core.generated import autoscaler_pb2

    ray._private.worker.global_worker.gcs_client.drain_node(
        node_id,
        autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"),
        "corral benchmark: preemption",
        int((time.time() + seconds) * 1000),
    )


def _until(check, limit: float = 60.0) -> float:
    t = time.monotonic()
    while not check():
        if time.monotonic() - t > limit:
            raise TimeoutError("benchmark condition not reached")
        time.sleep(0.01)
    return time.monotonic() - t


def ray_node_faults(make, cluster, gpus_per_node: int) -> dict:
    job = Job(role="w", replicas=1, tasks=[SchedulingSpec(cpu=1, gpu=1)])
    hog = make(f"hog{os.getpid()}r")
    hog.create_workers(
        Job(role="hog", replicas=2, tasks=[SchedulingSpec(cpu=1, gpu=gpus_per_node)])
    )
    node = cluster.add_node(num_cpus=2, num_gpus=gpus_per_node)
    out: dict = {}
    try:
        cluster.wait_for_nodes()
        base = make(f"base{os.getpid()}")
        base.create_workers(job)
        t = time.monotonic()
        base.close()
        out["close_healthy_s"] = time.monotonic() - t
        deaths: list[float] = []
        sched = make(
            f"raylet{os.getpid()}", on_worker_death=lambda w, e: deaths.append(time.monotonic())
        )
        sched.create_workers(job)
        asyncio.run(sched.create_engine("w/0", ECHO, "e"))
        marker = os.path.join(tempfile.mkdtemp(prefix="corral-drain-"), "preempted")
        sched.call_engine("w/0", "mark_preempt", "e", marker)
        pid = sched.get_workers("w")[0].pid
        _drain(node.node_id, 60)
        out["drain_to_on_preempt_s"] = _until(lambda: os.path.exists(marker))
        raylet = node.all_processes["raylet"][0].process
        t = time.monotonic()
        os.kill(raylet.pid, signal.SIGKILL)
        raylet.wait()  # reaped, as init does on a real node
        while True:
            try:
                sched.call_engine("w/0", "echo", "e", 1, rpc_meta={"timeout": 5})
            except WorkerFailedError as exc:
                assert "raylet" in str(exc), exc
                break
            time.sleep(0.01)
        out["raylet_kill_to_call_error_s"] = time.monotonic() - t
        _until(lambda: bool(deaths))
        out["raylet_kill_to_callback_s"] = deaths[0] - t
        t = time.monotonic()
        sched.close()
        out["close_after_raylet_death_s"] = time.monotonic() - t
        out["worker_pids_left"] = int(pid_alive(pid))
    finally:
        hog.close()
        cluster.remove_node(node)
        cluster.wait_for_nodes()
    return out
