"""Exact GPU device sets and per-node LOCAL_RANK on every backend, and the local GPU ledger.

GPUs are declared, not physical: the local backend is given device indices, the Ray test
cluster declares 8 GPUs per node and the Slurm lab 4 gres GPUs per node. What is checked is
the exact ``CUDA_VISIBLE_DEVICES`` each worker process sees.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict

import pytest

from corral import ConfigError, Job, SchedulingSpec
from tests.conformance.harness import node_of

ECHO = "corral.testing.engines.EchoEngine"


def _devices(value: str) -> list[int]:
    return [int(d) for d in value.split(",") if d != ""]


def _observe(sched, ids: list[str]) -> list[dict]:
    seen = []
    for wid in ids:
        asyncio.run(sched.create_engine(wid, ECHO, "e"))
        seen.append(
            {
                "id": wid,
                "node": node_of(sched, wid),
                "devices": _devices(sched.call_engine(wid, "getenv", "e", "CUDA_VISIBLE_DEVICES")),
                "local_rank": int(sched.call_engine(wid, "getenv", "e", "LOCAL_RANK")),
                "rank": int(sched.call_engine(wid, "getenv", "e", "RANK")),
            }
        )
    return seen


def test_gpu_role_gets_exact_devices_and_local_ranks_per_node(sched, backend):
    """Two GPUs per worker, filling every GPU of the role's nodes (one node on local, two
    on Ray and Slurm): on each node the workers' LOCAL_RANKs are 0..n-1 in rank order and
    their device sets split the node's devices exactly; children forked next to them see
    exactly their devices."""
    per_node = backend.gpus_per_node // 2
    nodes = 1 if sched.backend == "local" else 2
    ids = sched.create_workers(
        Job(role="gpu", replicas=nodes * per_node, tasks=[SchedulingSpec(cpu=1, gpu=2)])
    )
    seen = _observe(sched, ids)
    by_node: dict[str, list[dict]] = defaultdict(list)
    for w in seen:
        by_node[w["node"]].append(w)
    assert len(by_node) == nodes, f"expected {nodes} node(s): {seen}"
    for node, workers in by_node.items():
        workers.sort(key=lambda w: w["rank"])
        assert [w["local_rank"] for w in workers] == list(range(per_node)), (node, workers)
        assert all(len(w["devices"]) == 2 for w in workers), workers
        flat = sorted(d for w in workers for d in w["devices"])
        assert flat == list(range(backend.gpus_per_node)), (node, workers)
        if sched.backend in ("local", "slurm"):
            # first fit on local; SLURM_LOCALID-th pair of the node's allocation on Slurm
            for w in workers:
                k = w["local_rank"]
                assert w["devices"] == [2 * k, 2 * k + 1], w
    children = sched.fork_workers("gpu_child", "gpu")
    for parent, child in zip(seen, children, strict=True):
        asyncio.run(sched.create_engine(child, ECHO, "e"))
        value = sched.call_engine(child, "getenv", "e", "CUDA_VISIBLE_DEVICES")
        assert _devices(value) == parent["devices"], (child, value, parent)


def test_cpu_only_workers_get_local_ranks_per_node(sched):
    """LOCAL_RANK counts the role's workers on each node, in rank order, from 0."""
    ids = sched.create_workers(Job(role="cpu", replicas=3, tasks=[SchedulingSpec(cpu=1)]))
    seen = _observe(sched, ids)
    counts: dict[str, int] = defaultdict(int)
    for w in sorted(seen, key=lambda w: w["rank"]):
        assert w["local_rank"] == counts[w["node"]], seen
        counts[w["node"]] += 1
    if sched.backend in ("local", "slurm"):  # Slurm packs a CPU-only role on one node
        assert [w["local_rank"] for w in seen] == [0, 1, 2]


# ------------------------------------------------------------- the local GPU ledger


@pytest.fixture
def local4(local_backend):
    s = local_backend.scheduler(gpu_devices=[0, 1, 2, 3])
    yield s
    s.close()


def _visible(sched, wid: str) -> str:
    asyncio.run(sched.create_engine(wid, ECHO, "e"))
    return sched.call_engine(wid, "getenv", "e", "CUDA_VISIBLE_DEVICES")


def test_local_devices_0_to_3_are_handed_out_exactly(local4):
    ids = local4.create_workers(Job(role="pair", replicas=2, tasks=[SchedulingSpec(gpu=2)]))
    assert [_visible(local4, wid) for wid in ids] == ["0,1", "2,3"]


def test_a_second_gpu_role_over_the_free_devices_is_refused(local4):
    """3 of 4 GPUs taken: asking for 2 more (fewer than the total) is refused before any
    worker starts, 1 more fits, and deleting a role frees its devices again."""
    (first,) = local4.create_workers(Job(role="big", replicas=1, tasks=[SchedulingSpec(gpu=3)]))
    assert _visible(local4, first) == "0,1,2"
    with pytest.raises(ConfigError, match=r"only 1 of 4 GPUs are free"):
        local4.create_workers(Job(role="late", replicas=1, tasks=[SchedulingSpec(gpu=2)]))
    assert local4.roles == ["big"]
    assert local4.launcher.pids("late") == []
    (one,) = local4.create_workers(Job(role="one", replicas=1, tasks=[SchedulingSpec(gpu=1)]))
    assert _visible(local4, one) == "3"
    with pytest.raises(ConfigError, match=r"only 0 of 4 GPUs are free"):
        local4.create_workers(Job(role="none", replicas=1, tasks=[SchedulingSpec(gpu=1)]))
    local4.delete_workers("big")
    (again,) = local4.create_workers(Job(role="again", replicas=1, tasks=[SchedulingSpec(gpu=3)]))
    assert _visible(local4, again) == "0,1,2"
