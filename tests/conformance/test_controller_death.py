"""A controller that is killed (SIGKILL) or interrupted (Ctrl-C) leaves nothing behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from tests.conformance.harness import pid_alive

SCRIPT = os.path.join(os.path.dirname(__file__), "controller_script.py")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["sigkill", "ctrl-c"])
def test_stopped_controller_leaves_no_worker_within_ten_seconds(backend, sig):
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
    )
    try:
        line = proc.stdout.readline()
        assert line, f"controller script failed: {proc.stderr.read()}"
        pids = json.loads(line)["pids"]
        assert len(pids) == 4 and all(pid_alive(p) for p in pids)
    finally:
        proc.send_signal(sig)
        proc.wait(30)
    deadline = time.monotonic() + 10
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [p for p in pids if pid_alive(p)] == []
    left = backend.leftovers(f"death-{backend.name}", trial)
    deadline = time.monotonic() + 10
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = backend.leftovers(f"death-{backend.name}", trial)
    assert left == []
