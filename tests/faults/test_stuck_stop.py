"""A worker told to go goes, even when its engine never returns: SIGTERM, a lost
controller lease and a second SIGTERM each end a real worker process whose engine
thread is stuck in a call (the orderly stop would wait for it forever: on_preempt and
destroy() run on that thread). corral.worker.ending bounds the stop (CORRAL_STOP_DEADLINE,
1 s here); its forked child goes with it. Local backend, real processes."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import pytest

from corral import BaseExperimentConfig, Job, LocalScheduler
from corral.controller.run_lease import read_lease
from corral.procs import pid_alive

ECHO = "corral.testing.engines.EchoEngine"
GONE_WITHIN = 30.0  # generous: only "it exits at all" is asserted, not how fast


@pytest.fixture
def local_sched(tmp_path, monkeypatch):
    monkeypatch.setenv("CORRAL_STOP_DEADLINE", "1")  # workers inherit it
    cfg = BaseExperimentConfig(experiment_name="stuck", trial_name=tmp_path.name[:40])
    s = LocalScheduler(exp_config=cfg, fileroot=str(tmp_path), gpu_devices=[])
    s.test_pids = []
    yield s
    for pid in s.test_pids:
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)  # a failed test leaves nothing behind
    s.close()


def _stuck_worker(local_sched) -> tuple[int, int]:
    """A worker whose engine thread is busy for an hour, with a forked child."""
    (wid,) = local_sched.create_workers(Job(role="stuck", replicas=1))
    local_sched.fork_workers("kid", "stuck")
    asyncio.run(local_sched.create_engine(wid, ECHO, "e"))
    threading.Thread(
        target=lambda: _ignore(local_sched.call_engine, wid, "sleep", "e", 3600), daemon=True
    ).start()
    time.sleep(1.0)  # the call has reached the engine thread
    pids = local_sched.get_workers("stuck")[0].pid, local_sched.get_workers("kid")[0].pid
    local_sched.test_pids.extend(pids)
    return pids


def _ignore(fn, *args):
    try:
        fn(*args)
    except Exception:
        pass


def _wait_gone(pids: list[int]) -> list[int]:
    deadline = time.monotonic() + GONE_WITHIN
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [p for p in pids if pid_alive(p)]


def test_sigterm_ends_a_worker_whose_engine_call_never_returns(local_sched):
    pid, child = _stuck_worker(local_sched)
    os.kill(pid, signal.SIGTERM)
    assert _wait_gone([pid, child]) == [], "SIGTERM was ignored by a worker with a stuck engine"


def test_a_lost_lease_ends_a_worker_whose_engine_call_never_returns(local_sched):
    pid, child = _stuck_worker(local_sched)
    lease = local_sched.parts.hold.lease  # the controller "dies": no more renewals, lease removed
    lease.release()
    assert (
        read_lease(
            local_sched.name_resolve.inner, local_sched.experiment_name, local_sched.trial_name
        )
        is None
    )
    assert _wait_gone([pid, child]) == [], "a worker that lost its lease stayed"
