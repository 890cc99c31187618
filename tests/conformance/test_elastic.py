"""Elastic roles: grow a role at runtime (new replicas join with the next ranks), shrink it
(the removed ones drain and stop), on every backend; everyone sees the new WORLD_SIZE."""

from __future__ import annotations

import asyncio
import time

import pytest

from corral import Job, SchedulingSpec, WorkerNotFoundError
from tests.conformance.harness import pid_alive

ECHO = "corral.testing.engines.EchoEngine"


def env_of(sched, wid: str, name: str) -> str | None:
    return sched.call_engine(wid, "getenv", "e", name)


def _log_names(path: str, worker_id: str, timeout: float = 15.0) -> bool:
    """Whether the log at ``path`` shows ``worker_id`` serving (logs are copied as written:
    bounded wait)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(path, errors="replace") as fh:
                if f"corral worker {worker_id} serving" in fh.read():
                    return True
        except FileNotFoundError:
            pass
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


def test_grow_then_shrink_a_role(sched):
    ids = sched.create_workers(Job(role="elastic", replicas=2, tasks=[SchedulingSpec(cpu=1)]))
    for wid in ids:
        asyncio.run(sched.create_engine(wid, ECHO, "e"))
    first = sched.get_workers("elastic")

    grown = sched.scale("elastic", 4)
    assert grown == ["elastic/0", "elastic/1", "elastic/2", "elastic/3"]
    workers = sched.get_workers("elastic")
    # the first two were not touched: same processes
    assert [w.generation for w in workers[:2]] == [w.generation for w in first]
    for wid in grown[2:]:
        asyncio.run(sched.create_engine(wid, ECHO, "e"))
    assert [env_of(sched, w, "RANK") for w in grown] == ["0", "1", "2", "3"]
    assert {env_of(sched, w, "WORLD_SIZE") for w in grown} == {"4"}
    for index in (2, 3):  # each new replica writes its own log, under its own index
        assert _log_names(sched.paths.replica_log("elastic", index), f"elastic/{index}")

    removed = sched.get_workers("elastic")[1:]
    kept = sched.scale("elastic", 1)
    assert kept == ["elastic/0"]
    assert [w.id for w in sched.get_workers("elastic")] == kept
    assert env_of(sched, kept[0], "WORLD_SIZE") == "1"
    assert sched.call_engine(kept[0], "echo", "e", 5) == 5
    deadline = time.monotonic() + 15
    while any(pid_alive(w.pid) for w in removed) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [w.id for w in removed if pid_alive(w.pid)] == []
    with pytest.raises(WorkerNotFoundError):
        sched.call_engine("elastic/3", "echo", "e", 1)
    # and it grows again after shrinking, reusing the freed indices
    assert sched.scale("elastic", 2) == ["elastic/0", "elastic/1"]
    assert sched.health("elastic/1")["status"] == "ok"
