"""The engine thread: calls run in order on one thread, errors reach the caller, a call
made from the engine thread itself runs inline (no deadlock), and tasks queued when it
shuts down are cancelled (their callers get an answer) instead of left hanging."""

from __future__ import annotations

import threading
import time

import pytest

from corral.worker.engines import EngineThread


class Task:
    def __init__(self, log: list, name: str, delay: float = 0.0):
        self.log, self.name, self.delay = log, name, delay
        self.done = threading.Event()

    def run(self):
        time.sleep(self.delay)
        self.log.append(("ran", self.name, threading.current_thread().name))
        self.done.set()

    def cancel(self):
        self.log.append(("cancelled", self.name, None))
        self.done.set()


def test_calls_and_tasks_run_in_order_on_the_one_engine_thread():
    engine = EngineThread()
    log: list = []
    tasks = [Task(log, f"t{i}") for i in range(5)]
    for t in tasks:
        engine.submit(t)
    assert engine.run(lambda: threading.current_thread().name) == "corral-engine_0"
    assert [entry[1] for entry in log] == [f"t{i}" for i in range(5)]
    assert {entry[2] for entry in log} == {"corral-engine_0"}
    engine.close()


def test_errors_reach_the_caller_and_reentrant_calls_run_inline():
    engine = EngineThread()
    with pytest.raises(ValueError, match="boom"):
        engine.run(lambda: (_ for _ in ()).throw(ValueError("boom")))
    assert engine.run(lambda: engine.run(lambda: 41) + 1) == 42  # would deadlock if queued
    engine.close()


def test_tasks_queued_at_shutdown_are_cancelled_and_later_calls_refused():
    engine = EngineThread()
    log: list = []
    slow, queued = Task(log, "slow", delay=0.5), Task(log, "queued")
    engine.submit(slow)
    engine.submit(queued)
    time.sleep(0.1)  # slow is running, queued waits behind it
    engine.close()
    assert queued.done.wait(5) and slow.done.wait(5)
    assert ("cancelled", "queued", None) in log
    with pytest.raises(RuntimeError, match="shut down"):
        engine.run(lambda: 1)
