"""corral.worker.ending: a stopping worker leaves when its stop overruns the deadline or
on a second SIGTERM, killing its children first (exit replaced by a recorder here)."""

from __future__ import annotations

import os
import signal
import threading

from corral.stop_deadline import stop_deadline
from corral.worker.ending import StopWatchdog


def _watchdog():
    exited = threading.Event()
    calls: list = []

    def exit_(code):
        calls.append(("exit", code))
        exited.set()

    dog = StopWatchdog("w/0", kill_children=lambda: calls.append(("kill",)), exit=exit_)
    return dog, calls, exited


def test_an_overrunning_stop_ends_the_worker_after_killing_its_children():
    dog, calls, exited = _watchdog()
    dog.arm(143, "SIGTERM", deadline=0.2)
    assert exited.wait(10)
    assert calls == [("kill",), ("exit", 143)]


def test_a_second_sigterm_ends_a_stopping_worker_at_once():
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        dog, calls, exited = _watchdog()
        dog.arm(0, "lease lost", deadline=3600)
        os.kill(os.getpid(), signal.SIGTERM)
        assert exited.wait(10)
        assert calls == [("kill",), ("exit", 0)]
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def test_the_deadline_comes_from_the_environment_or_the_default():
    assert stop_deadline({"CORRAL_STOP_DEADLINE": "2.5"}) == 2.5
    assert stop_deadline({}) == 5.0
    assert stop_deadline({"CORRAL_STOP_DEADLINE": "soon"}) == 5.0
