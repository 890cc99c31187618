"""Multi-node instances (docs/shapes.md): ``gpu = 2 * n_gpus_per_node`` is one worker on
two whole nodes (one Ray placement group over 2 nodes, one Slurm job over 2 nodes), with a
member worker on the second node that gets the node variables a multi-node server needs.
The local backend (one host) refuses the shape. GPUs are declared, not physical."""

from __future__ import annotations

import asyncio
import subprocess
import time

import pytest

from corral import Job, SchedulingSpec, WorkerFailedError
from corral.errors import GPURequestError

ECHO = "corral.testing.engines.EchoEngine"


def _server(backend) -> Job:
    spec = SchedulingSpec(cpu=2, gpu=2 * backend.gpus_per_node, mem=2, port_count=3)
    return Job(role="server", replicas=1, tasks=[spec])


def test_local_refuses_a_multinode_worker(backend):
    if backend.name != "local":
        pytest.skip(f"the {backend.name} backend places multi-node workers")
    sched = backend.scheduler()
    try:
        with pytest.raises(GPURequestError) as info:
            sched.create_workers(_server(backend))
        text = str(info.value)
        assert "multi-node instance" in text and "one host" in text, text
        assert sched.roles == []
    finally:
        sched.close()


def test_a_worker_that_is_not_a_whole_number_of_nodes_is_refused_with_the_fix(sched, backend):
    g = backend.gpus_per_node
    with pytest.raises(GPURequestError) as info:
        sched.create_workers(Job(role="odd", replicas=1, tasks=[SchedulingSpec(gpu=g + 1)]))
    assert f"gpu={g} or {2 * g}" in str(info.value), str(info.value)


def _env(sched, wid: str, name: str) -> str | None:
    return sched.call_engine(wid, "getenv", "e", name)


def test_a_two_node_instance_runs_its_member_and_hands_over_the_rendezvous(sched, backend):
    if backend.name == "local":
        pytest.skip("the local backend runs on one host")
    g = backend.gpus_per_node
    assert sched.create_workers(_server(backend)) == ["server/0"]
    (worker,) = sched.get_workers("server")
    instance = sched.instance("server/0")
    (member,) = instance.members
    assert worker.member_hosts == [member.host] and member.host != worker.host
    assert instance.hosts == (worker.host, member.host)
    assert instance.head == (worker.ip, worker.reserved_ports[-1])
    for rank, wid in enumerate([worker.id, member.id]):
        asyncio.run(sched.create_engine(wid, ECHO, "e"))
        assert _env(sched, wid, "CORRAL_NNODES") == "2"
        assert _env(sched, wid, "CORRAL_NODE_RANK") == str(rank)
        assert _env(sched, wid, "CORRAL_HEAD_ADDR") == worker.ip
        assert _env(sched, wid, "CORRAL_HEAD_PORT") == str(worker.reserved_ports[-1])
        assert len(_env(sched, wid, "CUDA_VISIBLE_DEVICES").split(",")) == g
    if backend.name == "ray":
        import ray
        from ray.util.placement_group import placement_group_table

        from corral.backends.ray.state import name_prefix

        used = ray.cluster_resources()["GPU"] - ray.available_resources().get("GPU", 0)
        assert used == 2 * g
        prefix = name_prefix(sched.experiment_name, sched.trial_name)
        (table,) = [
            v for v in placement_group_table().values() if v["name"] == f"{prefix}:server:0"
        ]
        assert table["strategy"] == "STRICT_SPREAD" and len(table["bundles"]) == 2
        assert len(set(table["bundles_to_node_id"].values())) == 2
    else:
        (job_id,) = sched.launcher.job_ids("server")
        out = subprocess.run(
            ["squeue", "-h", "-j", job_id, "-o", "%D"], capture_output=True, text=True
        ).stdout.split()
        assert out == ["2"], out

    backend.kill_worker(member)
    deadline = time.monotonic() + 60
    with pytest.raises(WorkerFailedError) as info:
        while time.monotonic() < deadline:
            sched.get_workers("server")
            time.sleep(0.2)
    text = str(info.value)
    assert "server/0" in text and f"on node {member.host}" in text, text

    sched.delete_workers("server")
    assert sched.roles == []
    left = backend.leftovers(sched.experiment_name, sched.trial_name)
    assert not left, left
