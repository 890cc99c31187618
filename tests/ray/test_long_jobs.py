"""Long jobs on the real two-node Ray cluster: a request that waits for busy GPUs says
why while it waits, and starts once they are free. (GPUs are declared, not physical.)"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid

import pytest

from tests.conformance.backend_ray import GPUS_PER_NODE, ray_cluster  # noqa: F401
from tests.conformance.test_run_identity import end_controller, start_controller, wait_gone
from tests.ray.test_ray_backend import gpu_job, make  # noqa: F401

pytestmark = pytest.mark.ray
ECHO = "corral.testing.engines.EchoEngine"


def test_outlive_controller_is_refused_on_a_runtime_that_ends_with_this_process():
    from corral import ConfigError
    from corral.backends.ray.launcher import RayLauncher
    from corral.spec import normalize_job

    launcher = RayLauncher(dry_run=True)
    launcher.own_cluster, launcher.outlive = True, 60.0  # as after ray.init("local")
    with pytest.raises(ConfigError) as info:
        launcher.check(normalize_job(gpu_job("w", 1, gpu=0)))
    message = str(info.value)
    assert "outlive_controller" in message and "60" in message and "RAY_ADDRESS" in message


def test_detached_workers_whose_grace_runs_out_exit_and_remove_their_groups(
    ray_backend,
    ray_cluster,  # noqa: F811
):
    experiment, trial = "ray-grace", uuid.uuid4().hex[:8]
    proc, first = start_controller(ray_backend, experiment, trial, lease_timeout=1, outlive=1)
    try:
        assert ray_cluster.leftovers(experiment, trial), "the run made no detached actors"
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        assert wait_gone(first["pids"], timeout=30) == []
        deadline = time.monotonic() + 15
        while ray_cluster.leftovers(experiment, trial) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert ray_cluster.leftovers(experiment, trial) == []
    finally:
        end_controller(proc)


def test_a_raylet_death_is_named_at_once_close_is_prompt_and_no_worker_is_left(
    ray_cluster,  # noqa: F811
    make,  # noqa: F811
):
    """Only the raylet of one node is SIGKILLed (its other processes live on). Ray marks
    such a node dead only after its health checks give up (~15 s); corral asks the raylet
    itself: the call and the death callback name the raylet, close() does not wait for
    what Ray can no longer stop, and the worker process is gone (checked by pid)."""
    from corral import WorkerFailedError
    from tests.conformance.test_run_identity import wait_gone

    cluster = ray_cluster.cluster
    hog = make()  # the session's two nodes are full: the worker can only use the extra node
    hog.create_workers(gpu_job("hog", 2, gpu=GPUS_PER_NODE))
    node = cluster.add_node(num_cpus=2, num_gpus=GPUS_PER_NODE)
    pid = None
    try:
        cluster.wait_for_nodes()
        deaths: list = []
        sched = make(on_worker_death=lambda wid, exit_: deaths.append(exit_.reason))
        sched.create_workers(gpu_job("w", 1, gpu=1))
        asyncio.run(sched.create_engine("w/0", ECHO, "e"))
        pid = sched.get_workers("w")[0].pid
        raylet = node.all_processes["raylet"][0].process
        others = [
            p.process for kind, procs in node.all_processes.items() if kind != "raylet"
            for p in procs
        ]  # fmt: skip
        os.kill(raylet.pid, signal.SIGKILL)
        raylet.wait()  # reaped, as init does on a real node (else Ray sees a zombie alive)
        assert all(p.poll() is None for p in others), "only the raylet was to die"
        deadline = time.monotonic() + 30
        with pytest.raises(WorkerFailedError) as info:
            while time.monotonic() < deadline:
                sched.call_engine("w/0", "echo", "e", 1, rpc_meta={"timeout": 5})
                time.sleep(0.1)
        assert "lost its node's raylet" in str(info.value), str(info.value)
        while not deaths and time.monotonic() < deadline:
            time.sleep(0.05)
        assert deaths and "raylet" in deaths[0], deaths
        sched.close()  # (the fixture checks Ray's tables once the node is marked dead)
        assert wait_gone([pid], timeout=10) == [], "the worker process outlived close()"
    finally:
        if pid:
            _kill_if_alive(pid)
        hog.close()
        cluster.remove_node(node)
        cluster.wait_for_nodes()  # until Ray marks the node dead (its health checks)


def _kill_if_alive(pid: int) -> None:
    from corral.procs import pid_alive

    if pid_alive(pid):
        os.kill(pid, signal.SIGKILL)
