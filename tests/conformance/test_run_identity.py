"""Run identity: a rerun under the same experiment/trial cleans up what a dead controller
left (and says what it removed); a second live controller is refused naming the clash."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from corral import Job, SchedulingSpec, TrialInUseError
from tests.conformance.harness import pid_alive

SCRIPT = os.path.join(os.path.dirname(__file__), "controller_script.py")


def start_controller(
    backend,
    experiment: str,
    trial: str,
    lease_timeout: float | None = None,
    outlive: float | None = None,
):
    argv = [
        sys.executable,
        SCRIPT,
        backend.name,
        backend.fileroot,
        experiment,
        trial,
        str(backend.gpus_per_node),
    ]
    if lease_timeout is not None or outlive is not None:
        argv.append(str(lease_timeout if lease_timeout is not None else 5.0))
    if outlive is not None:
        argv.append(str(outlive))
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **backend.controller_env},
    )
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        pytest.fail(f"controller script failed: {proc.stderr.read()}")
    return proc, json.loads(line)


def end_controller(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
    proc.wait(30)


def wait_gone(pids: list[int], timeout: float = 15.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [p for p in pids if pid_alive(p)]


def test_live_second_controller_is_refused_naming_the_clash(backend):
    experiment, trial = f"runid-{backend.name}", f"live{uuid.uuid4().hex[:6]}"
    proc, first = start_controller(backend, experiment, trial)
    try:
        secret_file = os.path.join(backend.fileroot, "secrets", experiment, trial, "secret")
        with open(secret_file) as fh:
            first_secret = fh.read()
        second = backend.scheduler(experiment=experiment, trial=trial)
        try:
            with pytest.raises(TrialInUseError) as info:
                second.create_workers(Job(role="w", replicas=1, tasks=[SchedulingSpec(cpu=1)]))
        finally:
            second.close()
        message = str(info.value)
        assert first["run_id"] in message
        assert f"{experiment}/{trial}" in message
        assert f"corral stop {experiment} {trial}" in message
        # the refused controller changed nothing of the live run
        assert all(pid_alive(p) for p in first["pids"])
        with open(secret_file) as fh:
            assert fh.read() == first_secret
    finally:
        end_controller(proc)
    assert wait_gone(first["pids"]) == []


def test_rerun_cleans_up_what_the_dead_controller_left(backend):
    experiment, trial = f"runid-{backend.name}", f"dead{uuid.uuid4().hex[:6]}"
    # the old run's workers would outlive it for 10 minutes: only the cleanup removes them
    proc, first = start_controller(backend, experiment, trial, lease_timeout=600)
    lines: list[str] = []
    try:
        proc.send_signal(signal.SIGSTOP)  # "dead": its lease stops, its pid stays
        time.sleep(2.5)  # older than the new run's lease timeout (1 s) + 1 s
        assert all(pid_alive(p) for p in first["pids"])
        sched = backend.scheduler(
            experiment=experiment, trial=trial, lease_timeout=1.0, progress=lines.append
        )
        try:
            ids = sched.create_workers(
                Job(role="orphan", replicas=2, tasks=[SchedulingSpec(cpu=1)])
            )
            assert wait_gone(first["pids"]) == []
            removed = " ".join(sched.removed_leftovers)
            assert "orphan/0" in removed and "orphan/1" in removed, sched.removed_leftovers
            assert any("cleaned up after the dead controller" in line for line in lines)
            assert first["run_id"] in " ".join(lines)
            # the new run's workers are untouched by the old ones' exit
            for worker_id in ids:
                assert sched.health(worker_id)["status"] == "ok"
            assert [w.id for w in sched.get_workers("orphan")] == ids
        finally:
            sched.close()
    finally:
        end_controller(proc)
    left = backend.leftovers(experiment, trial)
    deadline = time.monotonic() + 15
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = backend.leftovers(experiment, trial)
    assert left == []
