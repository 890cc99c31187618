"""Colocation: reuse the target's workers, or fork new ones next to them."""

from __future__ import annotations

import asyncio
import time

from corral import Job, SchedulingSpec, SchedulingStrategy
from tests.conformance.harness import pid_alive

ECHO = "corral.testing.engines.EchoEngine"


def test_colocation_without_fork_reuses_target_workers(sched):
    rollout = sched.create_workers(Job(role="rollout", replicas=2))
    ref = sched.create_workers(
        Job(
            role="ref",
            replicas=2,
            scheduling_strategy=SchedulingStrategy("colocation", "rollout", fork=False),
        )
    )
    assert ref == rollout
    assert [w.pid for w in sched.get_workers("ref")] == [
        w.pid for w in sched.get_workers("rollout")
    ]


def test_fork_workers_start_children_next_to_their_targets(sched):
    rollout = sched.create_workers(Job(role="rollout", replicas=2, tasks=[SchedulingSpec(gpu=1)]))
    proxy = sched.fork_workers(role="proxy", target_role="rollout", command=None)
    assert proxy == ["proxy/0", "proxy/1"]
    parents = sched.get_workers("rollout")
    children = sched.get_workers("proxy")
    for parent, child in zip(parents, children, strict=True):
        assert child.forked and child.pid != parent.pid
        assert child.host == parent.host
        assert child.index == parent.index  # replica i's child is proxy/i, beside it
    for wid in proxy + rollout:
        asyncio.run(sched.create_engine(wid, ECHO, "e"))
    assert sched.call_engine("proxy/0", "getenv", "e", "CUDA_VISIBLE_DEVICES") == sched.call_engine(
        "rollout/0", "getenv", "e", "CUDA_VISIBLE_DEVICES"
    )
    assert sched.call_engine("proxy/1", "echo", "e", "hi") == "hi"


def test_colocation_with_fork_in_create_workers(sched):
    sched.create_workers(Job(role="gen", replicas=2))
    ids = sched.create_workers(
        Job(
            role="helper",
            replicas=2,
            scheduling_strategy=SchedulingStrategy("colocation", "gen", fork=True),
        )
    )
    assert ids == ["helper/0", "helper/1"]
    helpers, gens = sched.get_workers("helper"), sched.get_workers("gen")
    assert {w.pid for w in helpers}.isdisjoint(w.pid for w in gens)
    for helper, gen in zip(helpers, gens, strict=True):
        assert helper.forked and helper.host == gen.host, (helper, gen)


def test_deleting_forked_role_keeps_parent(sched):
    sched.create_workers(Job(role="gen", replicas=1))
    sched.fork_workers("helper", "gen")
    child = sched.get_workers("helper")[0].pid
    parent = sched.get_workers("gen")[0]
    sched.delete_workers("helper")
    deadline = time.monotonic() + 10
    while pid_alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(child)
    assert sched.health(parent.id)["status"] == "ok"


def test_deleting_target_takes_its_forks_along(sched):
    sched.create_workers(Job(role="gen", replicas=1))
    sched.fork_workers("helper", "gen")
    pids = [sched.get_workers("helper")[0].pid, sched.get_workers("gen")[0].pid]
    sched.delete_workers("gen")
    assert sched.roles == []
    deadline = time.monotonic() + 10
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(pid_alive(p) for p in pids)
