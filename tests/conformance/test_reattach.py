"""Re-attach (opt-in): workers asked to outlive their controller keep running after it
dies; a new controller made with ``attach=True`` takes the run over (calls, close), and
``corral ps/stop`` work on it from another shell meanwhile. Without the opt-in, attaching
is refused and the workers exit with their controller (fail-fast, the default).

On Ray the workers are then detached actors on detached placement groups, on the test's
Ray cluster, which outlives the first controller's driver (tests/ray/test_long_jobs.py
checks the cleanup when no controller comes back)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from corral import ConfigError, TrialInUseError
from tests.conformance.harness import pid_alive
from tests.conformance.test_run_identity import end_controller, start_controller, wait_gone


def _cli(backend, *args: str) -> str:
    return subprocess.run(
        [sys.executable, "-m", "corral.cli", "--fileroot", backend.fileroot, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **backend.controller_env},
    ).stdout


def _kill_left(pids: list[int]) -> None:
    """On the way out, whatever happened: SIGKILL every worker the test made outlive its
    controller or adopted, by pid (all test backends run on this machine)."""
    for pid in pids:
        if pid_alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _kill_controller_and_outwait_its_lease(proc) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    time.sleep(5.0 + 2.0)  # past the lease timeout (5 s): fail-fast workers would be gone


def test_a_new_controller_attaches_to_workers_that_outlive_their_controller(backend):
    experiment, trial = f"attach-{backend.name}", f"a{uuid.uuid4().hex[:6]}"
    proc, first = start_controller(backend, experiment, trial, outlive=120)
    sched = None
    try:
        _kill_controller_and_outwait_its_lease(proc)
        gone = [p for p in first["pids"] if not pid_alive(p)]
        assert not gone, f"workers did not outlive: {gone} of {first}"
        rows = [row for row in _cli(backend, "ps").splitlines() if trial in row]
        assert any("(controller)" in row and "NOT RENEWED" in row for row in rows), rows
        for wid in ("orphan/0", "orphan/1"):  # listed and answering, from another process
            assert any(wid in r and "unreachable" not in r and "dead" not in r for r in rows)
        deaths: list[str] = []
        sched = backend.scheduler(
            experiment=experiment,
            trial=trial,
            attach=True,
            on_worker_death=lambda wid, exit_: deaths.append(wid),
        )
        assert sched.run_id == first["run_id"]
        assert {"orphan", "orphan_child"} <= set(sched.roles)
        adopted = [w.pid for role in ("orphan", "orphan_child") for w in sched.get_workers(role)]
        assert sorted(adopted) == sorted(first["pids"])
        assert sched.health("orphan/1")  # a signed call with the run's secret
        # the backend adopted the processes: a death is seen like any other
        backend.kill_worker(sched.get_workers("orphan")[1])
        deadline = time.monotonic() + 30
        while "orphan/1" not in deaths and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "orphan/1" in deaths, sched.worker_status()
        sched.close()
        sched = None
        assert wait_gone(first["pids"], timeout=30) == []
        assert backend.leftovers(experiment, trial) == []
    finally:
        if sched is not None:
            sched.close()
        end_controller(proc)
        _cli(backend, "stop", experiment, trial)
        _kill_left(first["pids"])


def test_corral_stop_from_another_shell_stops_workers_that_outlive_their_controller(backend):
    experiment, trial = f"attach-{backend.name}", f"s{uuid.uuid4().hex[:6]}"
    proc, first = start_controller(backend, experiment, trial, outlive=120)
    try:
        _kill_controller_and_outwait_its_lease(proc)
        assert all(pid_alive(p) for p in first["pids"])
        _cli(backend, "stop", experiment, trial)
        assert wait_gone(first["pids"], timeout=30) == []
        deadline = time.monotonic() + 60  # Slurm jobs end after their tasks (COMPLETING)
        while backend.leftovers(experiment, trial) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert backend.leftovers(experiment, trial) == []
    finally:
        end_controller(proc)
        _kill_left(first["pids"])


def test_attach_to_a_run_whose_controller_lives_is_refused_even_if_it_outlives(backend):
    """Workers that may outlive their controller (``outlive_controller > 0``) are still
    that controller's while it lives: a second controller with ``attach=True`` is refused
    naming the live run, and takes nothing over."""
    experiment, trial = f"attach-{backend.name}", f"l{uuid.uuid4().hex[:6]}"
    proc, first = start_controller(backend, experiment, trial, outlive=120)
    try:
        with pytest.raises(TrialInUseError) as info:
            second = backend.scheduler(experiment=experiment, trial=trial, attach=True)
            second.close()  # only reached when attaching wrongly succeeded
        message = str(info.value)
        assert "controller is alive" in message and f"{experiment}/{trial}" in message
        assert first["run_id"] in message
        assert proc.poll() is None and all(pid_alive(p) for p in first["pids"])
        rows = [row for row in _cli(backend, "ps").splitlines() if trial in row]
        assert any("(controller)" in row and "NOT RENEWED" not in row for row in rows), rows
    finally:
        end_controller(proc)
        _cli(backend, "stop", experiment, trial)
        _kill_left(first["pids"])


def test_attach_after_the_grace_period_is_refused_naming_it(backend):
    """Workers outlive their controller only for ``outlive_controller`` seconds past the
    lease timeout: attaching later is refused with that reason (they have exited), not
    tried on workers that are gone."""
    experiment, trial = f"attach-{backend.name}", f"g{uuid.uuid4().hex[:6]}"
    proc, first = start_controller(backend, experiment, trial, outlive=2)
    try:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        time.sleep(5.0 + 2.0 + 2.0)  # past the lease timeout (5 s) + grace (2 s) + 1 s
        with pytest.raises(ConfigError) as info:
            backend.scheduler(experiment=experiment, trial=trial, attach=True)
        assert "past its grace period" in str(info.value) and first["run_id"] in str(info.value)
        assert wait_gone(first["pids"], timeout=30) == []  # they left by themselves
    finally:
        end_controller(proc)
        _cli(backend, "stop", experiment, trial)
        _kill_left(first["pids"])


def test_attach_is_refused_when_the_run_did_not_ask_its_workers_to_outlive_it(backend):
    experiment, trial = f"attach-{backend.name}", f"r{uuid.uuid4().hex[:6]}"
    proc, first = start_controller(backend, experiment, trial)
    try:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        with pytest.raises(ConfigError) as info:
            backend.scheduler(experiment=experiment, trial=trial, attach=True)
        assert "outlive_controller=0" in str(info.value) and first["run_id"] in str(info.value)
        assert wait_gone(first["pids"], timeout=30) == []  # fail-fast: they left by themselves
    finally:
        end_controller(proc)
        _cli(backend, "stop", experiment, trial)
        _kill_left(first["pids"])
