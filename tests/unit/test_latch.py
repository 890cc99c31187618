"""The worker's stop latch (corral/worker/latch.py) may be set from signal handlers.

A worker whose controller is SIGKILLed gets a burst of SIGTERMs (the parent-death signal
comes again each time the kernel re-parents it to another exiting thread of the
controller), so a second handler runs inside the first. With ``threading.Event`` the second
``set`` waited for the lock the first one held, in the same thread: the worker hung for
ever. Each case runs in a child process, so a hang is a timeout here, not a stuck suite."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

from corral.worker.latch import StopLatch

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src")


def _run(code: str, timeout: float = 30) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def test_set_from_another_thread_wakes_the_waiter_with_the_first_reason():
    stop = StopLatch()
    assert not stop.is_set() and stop.reason == ""

    def later() -> None:
        time.sleep(0.05)
        stop.set("controller pid 1 is gone")
        stop.set("SIGTERM")

    threading.Thread(target=later).start()
    assert stop.wait() == "controller pid 1 is gone"
    assert stop.is_set() and stop.reason == "controller pid 1 is gone"


def test_many_sets_never_block_the_setter():
    stop = StopLatch()
    for _ in range(100_000):  # far more bytes than a pipe holds: the extra ones are dropped
        stop.set("again")
    assert stop.wait() == "again" and len(stop.reasons) == 100_000
