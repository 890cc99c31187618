"""Loud failures: dead workers, timeouts, bad secrets, bad input before anything starts."""

from __future__ import annotations

import asyncio
import signal
import threading
import time

import pytest

from corral import (
    ConfigError,
    Job,
    SchedulingSpec,
    SchedulingStrategy,
    WorkerFailedError,
    WorkerTimeoutError,
)
from corral.errors import AuthenticationError
from corral.rpc.client import RPCClient
from tests.conformance.harness import pid_alive

ECHO = "corral.testing.engines.EchoEngine"


def test_worker_that_exits_gives_worker_failed_with_code_and_log_tail(sched):
    (wid,) = sched.create_workers(Job(role="doomed", replicas=1))
    asyncio.run(sched.create_engine(wid, ECHO, "e"))
    with pytest.raises(WorkerFailedError) as info:
        sched.call_engine(wid, "exit_now", "e", 7)
    assert info.value.worker_id == wid
    if sched.backend == "local":
        assert info.value.exit_code == 7
    assert "serving at" in info.value.log_tail
    with pytest.raises(WorkerFailedError):
        sched.get_workers("doomed")


def test_sigkill_mid_call_gives_worker_failed_not_a_hang(sched, backend):
    (wid,) = sched.create_workers(Job(role="victim", replicas=1))
    asyncio.run(sched.create_engine(wid, ECHO, "e"))
    worker = sched.get_workers("victim")[0]
    timer = threading.Timer(0.3, backend.kill_worker, args=(worker, signal.SIGKILL))
    timer.start()
    with pytest.raises(WorkerFailedError) as info:
        sched.call_engine(wid, "sleep", "e", 60, rpc_meta={"timeout": 50})
    timer.join()
    assert wid in str(info.value)
    with pytest.raises(WorkerFailedError):  # the death is remembered, not only reported once
        sched.get_workers("victim")


def test_sigstopped_worker_times_out_at_the_callers_deadline(sched, backend):
    (wid,) = sched.create_workers(Job(role="frozen", replicas=1))
    asyncio.run(sched.create_engine(wid, ECHO, "e"))
    worker = sched.get_workers("frozen")[0]
    backend.kill_worker(worker, signal.SIGSTOP)
    try:
        with pytest.raises(WorkerTimeoutError, match="frozen/0"):
            sched.call_engine(wid, "noop", "e", rpc_meta={"timeout": 1.0})
    finally:
        backend.kill_worker(worker, signal.SIGCONT)


def test_delete_workers_stops_a_frozen_worker_and_leaves_nothing(sched, backend):
    """A SIGSTOPped worker cannot exit when asked: the backend must force it (local:
    SIGKILL after the grace period; Ray: kill the actor; Slurm: scancel the job)."""
    (wid,) = sched.create_workers(Job(role="ice", replicas=1))
    worker = sched.get_workers("ice")[0]
    backend.kill_worker(worker, signal.SIGSTOP)
    try:
        sched.delete_workers("ice")
        assert sched.roles == []
        assert backend.leftovers(sched.experiment_name, sched.trial_name) == []
        deadline = time.monotonic() + 10
        while pid_alive(worker.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not pid_alive(worker.pid), f"{wid} (pid {worker.pid}) is still alive"
    finally:  # a failing run must not leave a stopped process behind for hours
        if pid_alive(worker.pid):
            backend.kill_worker(worker, signal.SIGKILL)


def test_wrong_secret_is_refused_and_has_no_effect(sched):
    (wid,) = sched.create_workers(Job(role="guarded", replicas=1))
    asyncio.run(sched.create_engine(wid, ECHO, "e"))
    worker = sched.get_workers("guarded")[0]
    intruder = RPCClient("not-the-secret")
    for path, payload in [
        ("/call", {"engine_name": "e", "method": "echo", "args": [1]}),
        ("/set_env", {"env": {"CORRAL_PWNED": "1"}}),
        ("/fork", {"role": "evil", "index": 0}),
        ("/create_engine", {"engine": "os.system", "args": ["true"]}),
    ]:
        with pytest.raises(AuthenticationError):
            intruder.request(worker.address, path, payload, timeout=5)
    with pytest.raises(AuthenticationError):
        intruder.request(worker.address, "/health", method="GET", timeout=5)
    assert sched.call_engine(wid, "getenv", "e", "CORRAL_PWNED") is None
    assert sched.call_engine(wid, "count", "e") == 0
    assert sched.health(wid)["forked_children"] == []


@pytest.mark.parametrize(
    "job, field",
    [
        (Job(role="x", replicas=1, tasks=[SchedulingSpec(gpu=99)]), "gpu"),
        (Job(role="x", replicas=0), "job.replicas"),
        (Job(role="x/y", replicas=1), "job.role"),
        (Job(role="..", replicas=1), "job.role"),
        (Job(role="x", replicas=3, tasks=[SchedulingSpec(), SchedulingSpec()]), "job.tasks"),
        (
            Job(
                role="x", replicas=1, scheduling_strategy=SchedulingStrategy("colocation", "nobody")
            ),
            "scheduling_strategy.target",
        ),
    ],
)
def test_bad_input_is_refused_before_anything_starts(sched, job, field):
    with pytest.raises(ConfigError) as info:
        sched.create_workers(job)
    assert field in str(info.value)
    assert sched.roles == []


def test_duplicate_role_and_replica_mismatch_are_refused(sched):
    sched.create_workers(Job(role="base", replicas=2))
    with pytest.raises(ConfigError, match="already exists"):
        sched.create_workers(Job(role="base", replicas=1))
    with pytest.raises(ConfigError, match="replicas=2"):
        sched.create_workers(
            Job(role="co", replicas=3, scheduling_strategy=SchedulingStrategy("colocation", "base"))
        )
    assert sched.roles == ["base"]
