"""Teardown on the local backend: engines are destroyed (and the scheduler waits for it)
before the backend stops the processes, and a worker that dies takes its forked children."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from corral import BaseExperimentConfig, Job, LocalScheduler
from corral.procs import pid_alive

ECHO = "corral.testing.engines.EchoEngine"


@pytest.fixture
def local_sched(tmp_path):
    cfg = BaseExperimentConfig(experiment_name="teardown", trial_name=tmp_path.name[:40])
    s = LocalScheduler(exp_config=cfg, fileroot=str(tmp_path), gpu_devices=[])
    yield s
    s.close()


def test_a_slow_destroy_finishes_before_the_worker_is_stopped(local_sched, tmp_path):
    """destroy() takes 3.5 s: longer than the local backend's 3 s SIGTERM-to-SIGKILL grace,
    shorter than the scheduler's 5 s /destroy_engines timeout. Destroying engines first
    (and waiting for it) is what lets it finish; a worker left to destroy its engines while
    being stopped is killed half-way."""
    ids = local_sched.create_workers(Job(role="slow", replicas=2))
    markers = [tmp_path / f"destroyed-{i}.txt" for i in range(2)]
    for wid, marker in zip(ids, markers, strict=True):
        asyncio.run(local_sched.create_engine(wid, ECHO, "e", tag=wid))
        local_sched.call_engine(wid, "mark_destroy", "e", str(marker), 3.5)
    local_sched.delete_workers("slow")
    assert [m.read_text() for m in markers] == [f"destroyed {wid}\n" for wid in ids]


def test_a_worker_killed_by_sigkill_takes_its_forked_child_along(local_sched):
    """The child asked for the parent-death signal: the controller and its lease are fine,
    so nothing else would end it."""
    local_sched.create_workers(Job(role="host", replicas=1))
    local_sched.fork_workers("child", "host")
    parent, child = local_sched.get_workers("host")[0], local_sched.get_workers("child")[0]
    os.kill(parent.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while pid_alive(child.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(child.pid), f"forked child {child.id} outlived its worker"
