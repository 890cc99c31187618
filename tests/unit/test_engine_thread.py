"""The engine thread: calls run in order on one thread, errors reach the caller, a call
made from the engine thread itself runs inline (no deadlock), and tasks queued when it
shuts down are cancelled (their callers get an answer) instead of left hanging."""

from __future__ import annotations

import threading
import time

import pytest

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


def test_tasks_held_back_run_after_release_in_order_then_finished_once():
    """``hold``/``release`` (the RPC server's batch of pipelined calls): what the holding
    thread submits waits for its release (another thread's calls do not), then runs in
    order on the engine thread, and ``finished`` runs once, after them."""
    engine = EngineThread()
    log: list = []
    tasks = [Task(log, f"t{i}") for i in range(5)]
    engine.hold()
    assert engine.holding()
    for t in tasks:
        engine.submit(t)
    other = threading.Thread(target=lambda: log.append(("other", engine.run(lambda: 7), None)))
    other.start()
    other.join(10)
    assert log == [("other", 7, None)]  # ran; the held tasks did not
    engine.release(None, lambda: log.append(("finished", None, threading.current_thread().name)))
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


def test_a_batch_settles_its_replies_after_each_task_and_says_which_is_last():
    """``Batch``: ``after(last)`` (the replies gathered so far leave, unless the
    connection's thread watches them: ``rpc.unsent``) runs after every task, so no reply
    waits long while a later call runs (any call may block, however quick it was
    before); ``last`` is True after the last task only; ``finished`` runs once, at the
    end."""
    log: list = []
    tasks = [Task(log, "a"), Task(log, "b"), Task(log, "c")]
    Batch(
        tasks, lambda last: log.append(("flush", last, None)), lambda: log.append(("end", 0, 0))
    ).run()
    assert [e[:2] for e in log] == [
        ("ran", "a"), ("flush", False), ("ran", "b"), ("flush", False), ("ran", "c"),
        ("flush", True), ("end", 0),
    ]  # fmt: skip


def test_a_release_with_nothing_to_run_still_says_it_finished():
    """No task held and no engine thread yet: ``after`` and ``finished`` run at once (the
    RPC server waits for ``finished`` before it refuses a bad frame)."""
    engine = EngineThread()
    log: list = []
    engine.hold()
    engine.release(lambda last: log.append(("after", last)), lambda: log.append("finished"))
    assert log == [("after", True), "finished"]
    engine.close()
