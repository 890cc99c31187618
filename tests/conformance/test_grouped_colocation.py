"""Grouped colocation on every backend: a few multi-GPU workers forked over the GPUs of
many smaller target workers, each seeing exactly its contiguous group of devices
(docs/shapes.md). GPUs are declared, not physical (local: device indices; Ray: declared
GPUs; Slurm: the lab's gres GPUs)."""

from __future__ import annotations

import asyncio
import subprocess
import time

import pytest

from corral import ConfigError, Job, SchedulingSpec, SchedulingStrategy
from tests.conformance.harness import pid_alive

ECHO = "corral.testing.engines.EchoEngine"


def _env(sched, wid: str, name: str) -> str:
    return sched.call_engine(wid, "getenv", "e", name)


def _devices(sched, wid: str) -> list[str]:
    return [d for d in (_env(sched, wid, "CUDA_VISIBLE_DEVICES") or "").split(",") if d]


def gpus_held(sched) -> object:
    """What the backend's ledger says this trial holds: local free devices, Ray's used
    GPUs, the trial's Slurm jobs and their gres (other users share the lab cluster)."""
    if sched.backend == "local":
        return sorted(sched.launcher.devices), len(sched.gpu_devices) - len(
            sched.launcher.gpus.free  # the ledger of free devices
        )
    if sched.backend == "ray":
        import ray

        return ray.cluster_resources().get("GPU", 0) - ray.available_resources().get("GPU", 0)
    ids = [j for role in sched.roles for j in sched.launcher.job_ids(role)]
    out = subprocess.run(
        ["squeue", "-h", "-o", "%i %b", "-j", ",".join(ids)], capture_output=True, text=True
    ).stdout
    return sorted(out.split("\n"))


def _target(sched, backend, replicas: int = 4):
    per = backend.gpus_per_node // 4  # local 2, Ray 2, Slurm lab 1: one node's worth
    spec = SchedulingSpec(cpu=1, gpu=per, ray_placement_strategy="shared")  # Ray: PACK
    ids = sched.create_workers(Job(role="actor", replicas=replicas, tasks=[spec]))
    for wid in ids:
        asyncio.run(sched.create_engine(wid, ECHO, "e"))
    return per, ids


def test_grouped_workers_see_exactly_their_contiguous_group(sched, backend):
    _grouped_over(sched, backend, actors=4, grouped=2)


def test_grouped_workers_over_two_nodes_stay_on_their_groups_nodes(sched, backend):
    if backend.name == "local":
        pytest.skip("the local backend has one node")
    hosts = _grouped_over(sched, backend, actors=8, grouped=4)
    assert len(set(hosts)) == 2, hosts  # two groups on each node


def _grouped_over(sched, backend, actors: int, grouped: int) -> list[str]:
    """Check a grouping of ``grouped`` workers over ``actors`` target workers (one
    node's worth of GPUs per 4 of them); the grouped workers' hosts."""
    per, actors = _target(sched, backend, replicas=actors)
    seen = {w.id: (w.host, _devices(sched, w.id)) for w in sched.get_workers("actor")}
    held = gpus_held(sched)

    size = len(actors) * per // grouped
    ids = sched.create_workers(
        Job(
            role="rollout",
            replicas=grouped,
            tasks=[SchedulingSpec(cpu=1, gpu=size)],
            scheduling_strategy=SchedulingStrategy("colocation", "actor"),
        )
    )
    assert ids == [f"rollout/{i}" for i in range(grouped)]
    # expected: each node's target devices in id order, cut into groups of ``size``
    nodes: dict[str, list[str]] = {}
    for host, devices in (seen[a] for a in actors):
        nodes.setdefault(host, []).extend(devices)
    expected = []
    for host, devices in nodes.items():
        ordered = sorted(devices, key=int)
        expected += [(host, ordered[i : i + size]) for i in range(0, len(ordered), size)]
    grouped = sched.get_workers("rollout")
    for worker, (host, devices) in zip(grouped, expected, strict=True):
        asyncio.run(sched.create_engine(worker.id, ECHO, "e"))
        assert worker.forked and worker.host == host, (worker, host)
        assert _devices(sched, worker.id) == devices, (worker.id, devices)
        assert _env(sched, worker.id, "ASCEND_RT_VISIBLE_DEVICES") == ",".join(devices)
    all_grouped = sorted(d for w in grouped for d in _devices(sched, w.id))
    assert all_grouped == sorted(d for _, ds in seen.values() for d in ds)  # no overlap
    for wid in actors:  # the target keeps its own devices
        assert (sched.get_workers("actor")[int(wid.split("/")[1])].host, _devices(sched, wid)) == (
            seen[wid]
        )
    assert gpus_held(sched) == held, "grouped colocation reserved GPUs a second time"

    pids = [w.pid for w in grouped]
    sched.delete_workers("rollout")
    deadline = time.monotonic() + 15
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(pid_alive(p) for p in pids)
    assert all(sched.health(a)["status"] == "ok" for a in actors)
    assert sched.call_engine("actor/3", "echo", "e", "still here") == "still here"
    return [w.host for w in grouped]


def test_deleting_the_target_first_retires_the_grouped_role(sched, backend):
    per, _ = _target(sched, backend)
    sched.create_workers(
        Job(
            role="rollout",
            replicas=1,
            tasks=[SchedulingSpec(cpu=1, gpu=4 * per)],
            scheduling_strategy=SchedulingStrategy("colocation", "actor"),
        )
    )
    (child,) = sched.get_workers("rollout")
    sched.delete_workers("actor")
    assert sched.roles == []
    deadline = time.monotonic() + 15
    while pid_alive(child.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(child.pid)


def test_a_shape_that_cannot_be_grouped_shows_the_arithmetic(sched, backend):
    per, _ = _target(sched, backend)
    colocate = SchedulingStrategy("colocation", "actor")
    with pytest.raises(ConfigError) as info:
        sched.create_workers(
            Job(role="r", replicas=3, tasks=[SchedulingSpec(gpu=per)], scheduling_strategy=colocate)
        )
    text = str(info.value)
    assert f"3 x {per} = {3 * per}" in text and f"4 x {per} = {4 * per}" in text, text
    assert "replicas=4" in text, text  # the fix
    with pytest.raises(ConfigError, match="fork=False reuses the 4 workers"):
        sched.create_workers(
            Job(
                role="r",
                replicas=2,
                scheduling_strategy=SchedulingStrategy("colocation", "actor", fork=False),
            )
        )
    assert sched.roles == ["actor"]


def test_equal_replica_colocation_and_reuse_still_work(sched, backend):
    per, actors = _target(sched, backend, replicas=2)
    forked = sched.create_workers(
        Job(
            role="helper",
            replicas=2,
            tasks=[SchedulingSpec(gpu=per)],
            scheduling_strategy=SchedulingStrategy("colocation", "actor"),
        )
    )
    reused = sched.create_workers(
        Job(
            role="ref",
            replicas=2,
            scheduling_strategy=SchedulingStrategy("colocation", "actor", fork=False),
        )
    )
    assert reused == actors and forked == ["helper/0", "helper/1"]
    for parent, child in zip(actors, forked, strict=True):
        asyncio.run(sched.create_engine(child, ECHO, "e"))
        assert _devices(sched, child) == _devices(sched, parent)
