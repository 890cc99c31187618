"""The controller's own cost per worker, on real local worker processes: its thread count
does not grow with the number of workers, and it holds a bounded number of file
descriptors per worker (the worker's output pipe and one pooled connection per call in
flight) plus a fixed number of log files."""

from __future__ import annotations

import asyncio
import os
import uuid

import pytest

from corral import BaseExperimentConfig, Job, SchedulingSpec
from corral.backends.local import LocalScheduler

ECHO = "corral.testing.engines.EchoEngine"


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def fds() -> list[str]:
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            found.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    return found


@pytest.fixture
def local_sched(tmp_path):
    cfg = BaseExperimentConfig(experiment_name="cost", trial_name=uuid.uuid4().hex[:8])
    s = LocalScheduler(exp_config=cfg, gpu_devices=[], fileroot=str(tmp_path), startup_timeout=120)
    yield s
    s.close()


def exercise(local_sched, role: str, n: int, in_flight: int = 4) -> None:
    """Start ``n`` workers, give each an engine, call each from one event loop with
    ``in_flight`` calls per worker at once."""
    ids = local_sched.create_workers(Job(role=role, replicas=n, tasks=[SchedulingSpec(cpu=0)]))

    async def calls():
        await asyncio.gather(*(local_sched.create_engine(i, ECHO) for i in ids))
        for _ in range(3):  # several calls in flight per worker
            await asyncio.gather(
                *(local_sched.async_call_engine(i, "noop") for i in ids * in_flight)
            )

    asyncio.run(calls())


def test_thread_count_does_not_grow_with_workers(local_sched):
    exercise(local_sched, "few", 2)
    with_few = threads()
    local_sched.delete_workers("few")
    exercise(local_sched, "many", 16)
    with_many = threads()
    local_sched.delete_workers("many")
    assert with_many <= with_few, f"{with_few} threads with 2 workers, {with_many} with 16"


def test_file_descriptors_per_worker_are_bounded(local_sched):
    n = 20
    before = fds()
    exercise(local_sched, "fd", n, in_flight=1)
    during = fds()
    logs = [p for p in during if p.startswith(str(local_sched.log_dir))]
    others = len(during) - len(before) - len(logs)
    new = sorted(set(during) - set(before))
    # fixed: two event loops' selectors and self-pipes
    assert others <= 2 * n + 8, f"{others} fds for {n} workers besides log files: {new}"
    assert len(logs) <= 16 + 2, f"{len(logs)} log files open for {n} workers"
    local_sched.delete_workers("fd")
    left = sorted(set(fds()) - set(before))
    # fixed: the role and merged log files, the controller's I/O loop self-pipe
    assert len(left) <= 4, f"descriptors left after delete_workers: {left}"
