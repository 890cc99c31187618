"""The engine thread: calls run in order on one thread, errors reach the caller, a call
made from the engine thread itself runs inline (no deadlock), and tasks queued when it
shuts down are cancelled (their callers get an answer) instead of left hanging."""

from __future__ import annotations

import threading
import time

import pytest

from corral.worker import engine_thread
from corral.worker.engine_thread import Batch
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


class QuickTask(Task):
    quick = True  # known to take well under a millisecond (``Batch``)


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


def test_tasks_held_back_run_after_release_in_order_then_after_once(monkeypatch):
    """``hold``/``release`` (the RPC server's batch of pipelined calls): what the holding
    thread submits waits for its release (another thread's calls do not), then runs in
    order on the engine thread, and ``after`` runs once, after them (no task takes
    ``FLUSH_SECONDS`` here: it is set out of reach of a loaded machine's pauses)."""
    monkeypatch.setattr(engine_thread, "FLUSH_SECONDS", 60.0)
    engine = EngineThread()
    log: list = []
    tasks = [QuickTask(log, f"t{i}") for i in range(5)]
    engine.hold()
    assert engine.holding()
    for t in tasks:
        engine.submit(t)
    other = threading.Thread(target=lambda: log.append(("other", engine.run(lambda: 7), None)))
    other.start()
    other.join(10)
    assert log == [("other", 7, None)]  # ran; the held tasks did not
    engine.release(lambda: log.append(("after", None, threading.current_thread().name)))
    assert not engine.holding()
    assert engine.run(lambda: "behind the batch") == "behind the batch"
    assert [entry[1] for entry in log[1:]] == [f"t{i}" for i in range(5)] + [None]
    assert {entry[2] for entry in log[1:]} == {"corral-engine_0"}
    engine.close()


def test_waiting_for_the_engine_thread_while_holding_runs_the_held_tasks_first():
    """A thread that holds tasks back and then waits on the engine thread (``run``) would
    wait forever for them: they go first."""
    engine = EngineThread()
    log: list = []
    engine.hold()
    engine.submit(Task(log, "held"))
    assert engine.run(lambda: log.append(("ran", "call", None)) or "done") == "done"
    engine.release()
    assert [entry[1] for entry in log] == ["held", "call"]
    engine.close()


def test_a_batch_sends_before_a_task_not_known_to_be_quick(monkeypatch):
    """``Batch``: ``after`` (a batch's replies leave) runs before each task that is not
    known to be quick, so a long call does not hold back the replies before it."""
    monkeypatch.setattr(engine_thread, "FLUSH_SECONDS", 60.0)
    log: list = []
    tasks = [QuickTask(log, "q1"), QuickTask(log, "q2"), Task(log, "?"), QuickTask(log, "q3")]
    Batch(tasks, lambda: log.append(("flush", None, None))).run()
    assert [e[1] or e[0] for e in log] == ["q1", "q2", "flush", "?", "q3", "flush"]


def test_a_batch_sends_once_flush_seconds_have_passed(monkeypatch):
    """``Batch``: replies wait at most ``FLUSH_SECONDS`` for the quick tasks after them
    (here 0: ``after`` runs after every task)."""
    monkeypatch.setattr(engine_thread, "FLUSH_SECONDS", 0.0)
    log: list = []
    Batch([QuickTask(log, "q1"), QuickTask(log, "q2")], lambda: log.append(("f", 0, 0))).run()
    assert [e[1] or e[0] for e in log] == ["q1", "f", "q2", "f", "f"]
