"""Workers come up, are found, report health and rendezvous variables, and go away."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from corral import Job, SchedulingSpec, WorkerNotFoundError
from tests.conformance.harness import node_of, pid_alive

ECHO = "corral.testing.engines.EchoEngine"


def test_create_workers_returns_role_index_ids_and_reachable_workers(sched):
    ids = sched.create_workers(Job(role="rollout", replicas=2, tasks=[SchedulingSpec(cpu=1)]))
    assert ids == ["rollout/0", "rollout/1"]
    workers = sched.get_workers("rollout")
    assert [w.id for w in workers] == ids
    for w in workers:
        assert w.port > 0 and w.ip
        health = sched.health(w.id)
        assert health["status"] == "ok" and health["worker_id"] == w.id


def test_job_may_be_any_object_with_the_four_attributes(sched):
    job = type(
        "Job",
        (),
        {"role": "actor", "replicas": 1, "tasks": [SchedulingSpec()], "scheduling_strategy": None},
    )()
    assert sched.create_workers(job) == ["actor/0"]


def test_rendezvous_variables_come_from_rank_zero(sched):
    ids = sched.create_workers(
        Job(role="trainer", replicas=2, tasks=[SchedulingSpec(port_count=2)])
    )
    workers = sched.get_workers("trainer")
    on_node: dict[str, int] = {}
    for i, wid in enumerate(ids):
        asyncio.run(sched.create_engine(wid, ECHO, "e"))
        env = {
            k: sched.call_engine(wid, "getenv", "e", k)
            for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
        }
        assert env["RANK"] == str(i)
        assert env["WORLD_SIZE"] == "2"
        node = node_of(sched, wid)
        assert env["LOCAL_RANK"] == str(on_node.get(node, 0)), (wid, node, on_node)
        on_node[node] = on_node.get(node, 0) + 1
        assert env["MASTER_ADDR"] and int(env["MASTER_PORT"]) > 0
    master_ports = {sched.call_engine(w, "getenv", "e", "MASTER_PORT") for w in ids}
    assert len(master_ports) == 1
    if sched.backend != "ray":
        assert int(master_ports.pop()) == int(workers[0].worker_ports[1])
    assert len(workers[0].worker_ports) == 2
    assert int(workers[0].worker_ports[0]) == workers[0].port  # the served port first


def test_gpus_are_exclusive_and_visible_through_cuda_visible_devices(sched):
    """Each worker sees exactly its 2 devices; workers on one node never share one.
    (Exact device sets per node: test_gpus_and_ranks.py.)"""
    ids = sched.create_workers(Job(role="gpu", replicas=2, tasks=[SchedulingSpec(gpu=2)]))
    taken: dict[str, list[int]] = {}
    for wid in ids:
        asyncio.run(sched.create_engine(wid, ECHO, "e"))
        value = sched.call_engine(wid, "getenv", "e", "CUDA_VISIBLE_DEVICES")
        devices = [int(d) for d in value.split(",") if d]
        assert len(devices) == 2 and len(set(devices)) == 2, f"{wid} got {value!r}"
        taken.setdefault(node_of(sched, wid), []).extend(devices)
    for node, devices in taken.items():
        assert len(devices) == len(set(devices)), f"workers on {node} share devices: {devices}"


def test_get_workers_of_unknown_role_names_it(sched):
    with pytest.raises(WorkerNotFoundError, match="nope"):
        sched.get_workers("nope")


def test_delete_workers_leaves_no_process(sched):
    sched.create_workers(Job(role="a", replicas=2))
    sched.create_workers(Job(role="b", replicas=1))
    pids = [w.pid for r in ("a", "b") for w in sched.get_workers(r)]
    assert all(pid_alive(p) for p in pids)
    sched.delete_workers("a")
    assert sched.roles == ["b"]
    sched.delete_workers(reverse_order=True)
    assert sched.roles == []
    deadline = time.monotonic() + 10
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [p for p in pids if pid_alive(p)] == []


def test_engines_are_destroyed_before_workers_stop(sched, tmp_path):
    (wid,) = sched.create_workers(Job(role="d", replicas=1))
    asyncio.run(sched.create_engine(wid, ECHO, "e", tag="bye"))
    marker = str(tmp_path / "destroyed.txt")
    sched.call_engine(wid, "mark_destroy", "e", marker)
    sched.delete_workers("d")
    assert open(marker).read() == "destroyed bye\n"


def test_role_can_be_created_again_after_delete(sched):
    sched.create_workers(Job(role="again", replicas=1))
    first = sched.get_workers("again")[0].pid
    sched.delete_workers("again")
    sched.create_workers(Job(role="again", replicas=1))
    second = sched.get_workers("again")[0]
    assert second.pid != first
    assert sched.health(second.id)["status"] == "ok"


def test_logs_per_replica_per_role_and_merged(sched):
    ids = sched.create_workers(Job(role="talker", replicas=2))
    for wid in ids:
        asyncio.run(sched.create_engine(wid, ECHO, "e"))
    sched.delete_workers("talker")
    deadline = time.monotonic() + 10
    merged = os.path.join(sched.log_dir, "merged.log")
    while time.monotonic() < deadline:
        text = open(merged).read() if os.path.exists(merged) else ""
        if "[talker/0]" in text and "[talker/1]" in text:
            break
        time.sleep(0.1)
    assert "[talker/0] corral worker talker/0 serving at" in text
    assert "[talker/1]" in text
    role_log = open(os.path.join(sched.log_dir, "talker.log")).read()
    assert "[talker/1]" in role_log
    replica = open(os.path.join(sched.log_dir, "talker", "0.log")).read()
    assert "corral worker talker/0 serving at" in replica and "[talker/0]" not in replica
