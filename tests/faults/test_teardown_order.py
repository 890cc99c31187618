"""Teardown order on the local backend: engines are destroyed (and the scheduler waits for
it) before the backend stops the processes."""

from __future__ import annotations

import asyncio

import pytest

from corral import BaseExperimentConfig, Job, LocalScheduler

ECHO = "corral.testing.engines.EchoEngine"


@pytest.fixture
def sched(tmp_path):
    cfg = BaseExperimentConfig(experiment_name="teardown", trial_name=tmp_path.name[:40])
    s = LocalScheduler(exp_config=cfg, fileroot=str(tmp_path), gpu_devices=[])
    yield s
    s.close()


def test_a_slow_destroy_finishes_before_the_worker_is_stopped(sched, tmp_path):
    """destroy() takes 3.8 s: longer than the local backend's 3 s SIGTERM-to-SIGKILL grace,
    shorter than the scheduler's 5 s /destroy_engines timeout. Destroying engines first
    (and waiting for it) is what lets it finish; a worker left to destroy its engines while
    being stopped is killed half-way."""
    ids = sched.create_workers(Job(role="slow", replicas=2))
    markers = [tmp_path / f"destroyed-{i}.txt" for i in range(2)]
    for wid, marker in zip(ids, markers, strict=True):
        asyncio.run(sched.create_engine(wid, ECHO, "e", tag=wid))
        sched.call_engine(wid, "mark_destroy", "e", str(marker), 3.8)
    sched.delete_workers("slow")
    assert [m.read_text() for m in markers] == [f"destroyed {wid}\n" for wid in ids]
