"""The worker's stop latch (corral/worker/latch.py) may be set from signal handlers.

A worker whose controller is SIGKILLed gets a burst of SIGTERMs (the parent-death signal
comes again each time the kernel re-parents it to another exiting thread of the
controller), so a second handler runs inside the first. With ``threading.Event`` the second
``set`` waited for the lock the first one held, in the same thread: the worker hung for
ever. Each case runs in a child process, so a hang is a timeout here, not a stuck suite."""

from __future__ import annotations

import os
import signal
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


def test_a_signal_handler_that_interrupts_another_ones_set_does_not_hang():
    # the second signal is raised at the worst moment: inside the first handler's set()
    out = _run(
        """
        import os, signal
        from corral.worker.latch import StopLatch

        stop = StopLatch()
        real_write = os.write

        def write_then_signal(fd, data):
            os.write = real_write
            signal.raise_signal(signal.SIGINT)  # its handler runs before this returns
            return real_write(fd, data)

        signal.signal(signal.SIGTERM, lambda *_: stop.set("SIGTERM"))
        signal.signal(signal.SIGINT, lambda *_: stop.set("SIGINT"))
        os.write = write_then_signal
        signal.raise_signal(signal.SIGTERM)
        print(stop.wait(), stop.reasons)
        """
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split(maxsplit=1) == ["SIGTERM", "['SIGTERM', 'SIGINT']\n"]


def test_a_burst_of_signals_wakes_the_waiting_main_thread_once():
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal; from corral.worker.latch import StopLatch; s = StopLatch(); "
            "signal.signal(signal.SIGTERM, lambda *_: s.set('SIGTERM')); "
            "print('ready', flush=True); print(s.wait(), flush=True); "
            "import sys; sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": SRC},
    )
    try:
        assert proc.stdout.readline() == "ready\n"
        for _ in range(50):
            os.kill(proc.pid, signal.SIGTERM)
        assert proc.stdout.readline() == "SIGTERM\n"
        # The child waits for stdin's end, so no signal of the burst can land while
        # the interpreter shuts down (which restores the default, killing handler).
        proc.stdin.close()
        assert proc.wait(30) == 0
        assert proc.stdout.read() == ""
    finally:
        proc.kill()
        proc.wait()


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
