"""The latch woken by real signals sent to a child process (the latch's logic:
tests/unit/test_latch.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from tests.unit.test_latch import (
    SRC,
    _run,
)


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
