"""Shared helpers for the live-view tests: a real trial and waiting on its stats file."""

from __future__ import annotations

import json
import os
import time

from corral.observe.source import stats_path


def read_stats(sched) -> dict | None:
    try:
        with open(stats_path(sched.fileroot, sched.experiment_name, sched.trial_name)) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def wait_stats(sched, predicate, timeout: float = 30.0, what: str = "") -> dict:
    """Poll the trial's stats file until ``predicate(snapshot)`` holds."""
    deadline = time.monotonic() + timeout
    snap = None
    while time.monotonic() < deadline:
        snap = read_stats(sched)
        try:
            if snap is not None and predicate(snap):
                return snap
        except (KeyError, IndexError, StopIteration):  # that role or worker is not there yet
            pass
        time.sleep(0.1)
    raise AssertionError(f"stats never showed {what} within {timeout}s; last: {snap}")


def worker_row(snap: dict, worker_id: str) -> dict:
    return next(w for w in snap["workers"] if w["id"] == worker_id)


def role_row(snap: dict, role: str) -> dict:
    return next(r for r in snap["roles"] if r["role"] == role)


def stats_mode(sched) -> int:
    path = stats_path(sched.fileroot, sched.experiment_name, sched.trial_name)
    return os.stat(path).st_mode & 0o777
