"""``corral top --once`` against a real local trial: the table in the terminal."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

from corral import Job
from tests.observe.helpers import wait_stats, worker_row


def _top(fileroot: str, *args: str) -> str:
    env = dict(os.environ, COLUMNS="200", TERM="dumb")
    out = subprocess.run(
        [sys.executable, "-m", "corral.cli", "--fileroot", fileroot, "top", "--once", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def _row(text: str, worker_id: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.split()[:1] == [worker_id])
    return line.split()


def test_top_prints_the_roles_and_workers_of_a_running_trial(local_backend):
    sched = local_backend.scheduler()
    try:
        ids = sched.create_workers(Job(role="rollout", replicas=2))
        asyncio.run(sched.create_engine(ids[0], "corral.testing.engines.EchoEngine", "e"))
        for _ in range(7):
            sched.call_engine(ids[0], "noop", "e")
        wait_stats(sched, lambda s: s["roles"] and s["roles"][0]["calls"]["total"] == 7, what="7")
        text = _top(local_backend.fileroot, sched.experiment_name, sched.trial_name)
        assert f"{sched.experiment_name} / {sched.trial_name}" in text and "live" in text
        for header in ("WORKER", "BACKEND", "HOST", "GPUS", "PID/JOB/ACTOR", "STATE", "UPTIME"):
            assert header in text
        assert _row(text, "rollout")[:5] == ["rollout", "launched", "2", "7", "0"]
        for w in sched.get_workers("rollout"):
            cells = _row(text, w.id)
            assert cells[1] == "local" and f"{w.pid}" in cells and "running" in cells
    finally:
        sched.close()


def test_top_shows_a_killed_worker_failed_with_its_exit_code(local_backend):
    sched = local_backend.scheduler()
    try:
        ids = sched.create_workers(Job(role="rollout", replicas=2))
        local_backend.kill_worker(sched.get_workers("rollout")[0])
        snap = wait_stats(sched, lambda s: worker_row(s, ids[0])["state"] == "failed", what="x")
        code = worker_row(snap, ids[0])["exit_code"]
        text = _top(local_backend.fileroot, sched.experiment_name, sched.trial_name)
        cells = _row(text, ids[0])
        assert "failed" in cells and cells[cells.index("failed") + 2] == str(code)
        assert f"{ids[0]} failed exit code {code} at " in text  # its time of death follows
        assert "running" in _row(text, ids[1])
    finally:
        sched.close()


def test_top_without_trials_says_so(tmp_path):
    assert "no trials found" in _top(str(tmp_path))


def test_a_trial_without_a_stats_file_is_listed_from_name_resolve(local_backend, monkeypatch):
    monkeypatch.setenv("CORRAL_STATS", "0")
    sched = local_backend.scheduler()
    try:
        sched.create_workers(Job(role="rollout", replicas=2))
        from corral.observe.source import stats_path

        assert not os.path.exists(
            stats_path(sched.fileroot, sched.experiment_name, sched.trial_name)
        )
        text = _top(local_backend.fileroot, sched.experiment_name, sched.trial_name)
        assert "registered" in text and "no stats file" in text
        for w in sched.get_workers("rollout"):
            cells = _row(text, w.id)
            assert f"{w.pid}" in cells and "registered" in cells
    finally:
        sched.close()


def test_top_refuses_a_name_that_leaves_the_fileroot(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "corral.cli", "--fileroot", str(tmp_path), "top", "..", "t", "--once"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and "experiment='..'" in done.stderr


def test_top_refreshes_count_times_into_a_pipe(local_backend):
    sched = local_backend.scheduler()
    try:
        (wid,) = sched.create_workers(Job(role="solo", replicas=1))
        wait_stats(sched, lambda s: worker_row(s, wid)["state"] == "running", what="running")
        text = _top_live(
            local_backend.fileroot,
            sched.experiment_name,
            sched.trial_name,
            "--count", "3", "--interval", "0.2",
        )  # fmt: skip
        assert text.count(f"{sched.experiment_name} / {sched.trial_name}") == 3
        assert text.count(f"\n{wid} ") == 3
    finally:
        sched.close()


def _top_live(fileroot: str, *args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "corral.cli", "--fileroot", fileroot, "top", *args],
        capture_output=True, text=True, timeout=60, env=dict(os.environ, COLUMNS="200"),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout
