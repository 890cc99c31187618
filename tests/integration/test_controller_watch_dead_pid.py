"""The controller watch with a real dead process: a controller pid that is gone counts as a
dead controller only on the controller's own host (pure watch logic:
tests/unit/test_controller_watch.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.unit.test_controller_watch import (
    LEASE,
    _runtime,
    _Watch,
)


@pytest.mark.parametrize("same_host", [True, False])
def test_a_dead_controller_pid_counts_only_on_the_same_host(same_host):
    import socket

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    host = socket.gethostname() if same_host else "another-host"
    rt = _runtime(controller_pid=gone.pid, controller_host=host)
    with _Watch(rt) as watch:
        for n in range(int(LEASE * 2 / 0.1)):
            watch.beat(n)
            if watch.done.wait(0.1):
                break
        if same_host:
            assert watch.lost == [f"controller pid {gone.pid} is gone"]
        else:
            assert watch.lost == [], "a pid on another host was checked on this one"
