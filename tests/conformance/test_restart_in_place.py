"""Restart in place (``max_restarts``): a dead replica is started again, its restart hook
runs, its siblings are never touched, and once the budget is spent the next death is final.
Without ``max_restarts`` a death is final at once. Where the new process lands is the
backend's business: Ray's same bundle (tests/ray/test_ray_backend.py), Slurm's same job,
node and GPUs (tests/slurm/test_slurm_backend.py)."""

from __future__ import annotations

import asyncio
import signal

import pytest

from corral import Job, SchedulingSpec, WorkerFailedError

ECHO = "corral.testing.engines.EchoEngine"


def test_max_restarts_starts_a_dead_replica_again_and_leaves_its_sibling(sched, backend):
    made = []

    def hook(s, worker_id):
        asyncio.run(s.create_engine(worker_id, ECHO, "e", tag="again"))
        made.append(worker_id)

    sched.set_restart_hook("phoenix", hook)
    ids = sched.create_workers(
        Job(role="phoenix", replicas=2, tasks=[SchedulingSpec(cpu=1, max_restarts=1)])
    )
    for wid in ids:
        asyncio.run(sched.create_engine(wid, ECHO, "e"))
    keeper, victim = sched.get_workers("phoenix")

    backend.kill_worker(victim, signal.SIGKILL)
    with pytest.raises(WorkerFailedError) as info:
        sched.call_engine(ids[1], "noop", "e")
    assert info.value.restarted and "restarted it (1 of 1)" in str(info.value)
    assert made == [ids[1]]

    kept, again = sched.get_workers("phoenix")
    assert (kept.pid, kept.generation) == (keeper.pid, keeper.generation)
    assert sched.call_engine(ids[0], "pid", "e") == keeper.pid
    assert again.pid != victim.pid and again.generation != victim.generation
    assert again.index == 1 and sched.call_engine(ids[1], "echo", "e", 5) == 5

    # the budget is spent: the second death is final, the sibling still answers
    backend.kill_worker(again, signal.SIGKILL)
    with pytest.raises(WorkerFailedError) as info:
        sched.call_engine(ids[1], "noop", "e")
    assert not info.value.restarted
    assert made == [ids[1]]
    assert sched.call_engine(ids[0], "echo", "e", 7) == 7


def test_without_max_restarts_a_death_is_final(sched, backend):
    (wid,) = sched.create_workers(Job(role="mortal", replicas=1))
    asyncio.run(sched.create_engine(wid, ECHO, "e"))
    backend.kill_worker(sched.get_workers("mortal")[0], signal.SIGKILL)
    with pytest.raises(WorkerFailedError) as info:
        sched.call_engine(wid, "noop", "e")
    assert not info.value.restarted and wid in str(info.value)
    with pytest.raises(WorkerFailedError):
        sched.get_workers("mortal")
