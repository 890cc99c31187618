"""A controller that is killed (SIGKILL), interrupted (Ctrl-C) or frozen (SIGSTOP: alive,
but its lease is no longer renewed) leaves nothing behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from tests.conformance.harness import pid_alive, sigint_not_ignored

SCRIPT = os.path.join(os.path.dirname(__file__), "controller_script.py")


@pytest.mark.parametrize(
    "sig",
    [signal.SIGKILL, signal.SIGINT, signal.SIGSTOP],
    ids=["sigkill", "ctrl-c", "frozen-lease"],
)
def test_stopped_controller_leaves_no_worker_within_ten_seconds(backend, sig):
    """SIGSTOP keeps the controller's pid alive and its lease key in name-resolve, so only
    the workers' lease-staleness check (lease 5 s) can end them."""
    trial = f"orphans{uuid.uuid4().hex[:6]}"
    env = {**os.environ, **backend.controller_env}
    proc = subprocess.Popen(
        [
            sys.executable,
            SCRIPT,
            backend.name,
            backend.fileroot,
            f"death-{backend.name}",
            trial,
            str(backend.gpus_per_node),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=sigint_not_ignored,
    )
    try:
        line = proc.stdout.readline()
        assert line, f"controller script failed: {proc.stderr.read()}"
        pids = json.loads(line)["pids"]
        assert len(pids) == 4 and all(pid_alive(p) for p in pids)
    finally:
        proc.send_signal(sig)
        if sig != signal.SIGSTOP:
            proc.wait(30)
    try:
        deadline = time.monotonic() + 10
        while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [p for p in pids if pid_alive(p)] == []
    finally:
        if sig == signal.SIGSTOP:  # the frozen controller's own resources go with it
            proc.kill()
            proc.wait(30)
    left = backend.leftovers(f"death-{backend.name}", trial)
    deadline = time.monotonic() + 10
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = backend.leftovers(f"death-{backend.name}", trial)
    assert left == []
