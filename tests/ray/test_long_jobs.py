"""Long jobs on the real two-node Ray cluster: a request that waits for busy GPUs says
why while it waits, and starts once they are free. (GPUs are declared, not physical.)"""

from __future__ import annotations

import threading
import time

import pytest

from tests.conformance.backend_ray import GPUS_PER_NODE, ray_cluster  # noqa: F401
from tests.ray.test_ray_backend import gpu_job, make  # noqa: F401

pytestmark = pytest.mark.ray


def test_waiting_for_busy_gpus_shows_the_pending_placement_then_starts(make):  # noqa: F811
    lines: list[str] = []
    other = make()  # another trial holds every GPU of both nodes
    other.create_workers(gpu_job("hog", 2, gpu=GPUS_PER_NODE))
    sched = make(startup_timeout=60, progress=lines.append)
    result: dict = {}

    def create():
        try:
            result["ids"] = sched.create_workers(gpu_job("patient", 1, gpu=1))
        except Exception as exc:  # reported below
            result["error"] = exc

    thread = threading.Thread(target=create)
    thread.start()
    deadline = time.monotonic() + 30
    while not any(line.startswith("waiting for patient") for line in lines):
        assert thread.is_alive(), result
        assert time.monotonic() < deadline, lines
        time.sleep(0.1)
    other.delete_workers("hog")
    thread.join(60)
    assert result.get("ids") == ["patient/0"], result
    waiting = next(line for line in lines if line.startswith("waiting for patient"))
    assert "PENDING" in waiting and "GPU 1" in waiting, waiting


def test_outlive_controller_is_refused_because_ray_actors_end_with_their_driver(make):  # noqa: F811
    from corral import ConfigError

    with pytest.raises(ConfigError) as info:
        make(outlive_controller=60)
    message = str(info.value)
    assert "outlive_controller" in message and "60" in message
    assert "local or slurm backend" in message


def test_a_worker_lost_with_its_node_is_preempted_and_comes_back_with_wait_role(
    ray_cluster,  # noqa: F811
    make,  # noqa: F811
):
    """Node loss with ``requeue=True``: calls raise WorkerPreemptedError, Ray places the
    bundle again on a new node, ``wait_role`` returns the worker with a new generation."""
    from corral import WorkerPreemptedError

    cluster = ray_cluster.cluster
    hog = make()  # the session's two nodes are full: the worker can only use the extra node
    hog.create_workers(gpu_job("hog", 2, gpu=GPUS_PER_NODE))
    added = [cluster.add_node(num_cpus=2, num_gpus=GPUS_PER_NODE)]
    try:
        cluster.wait_for_nodes()
        sched = make(requeue=True)
        sched.create_workers(gpu_job("learner", 1, gpu=1))
        old = sched.get_workers("learner")[0]
        cluster.remove_node(added.pop())
        error = None
        deadline = time.monotonic() + 60
        while error is None and time.monotonic() < deadline:
            try:
                sched.get_workers("learner")  # asks the backend whether they live
            except WorkerPreemptedError as exc:
                error = exc
            except Exception:
                pass  # not seen dead yet: the connection just fails
            time.sleep(0.2)
        assert isinstance(error, WorkerPreemptedError), "node loss was not seen as preemption"
        assert "node was lost" in str(error)
        added.append(cluster.add_node(num_cpus=2, num_gpus=GPUS_PER_NODE))
        assert sched.wait_role("learner", timeout=90) == ["learner/0"]
        new = sched.get_workers("learner")[0]
        assert new.generation != old.generation
        assert sched.health("learner/0")["status"] == "ok"
        sched.close()
    finally:
        hog.close()
        for node in added:
            cluster.remove_node(node)
        cluster.wait_for_nodes()
