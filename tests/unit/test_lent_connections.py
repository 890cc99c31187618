"""Connections lent to the engine thread (corral.rpc.connection, issue 29) on a real
in-process worker.

After a synchronous engine call on a one-request-at-a-time connection, the engine thread
itself waits on that connection and reads, runs and answers its next call. What must hold:
every engine method still runs on the one engine thread whoever read the request; a call
on another connection wakes the engine thread parked on the first (no starvation, no
deadlock); a client that gives up on a lent connection leaves the worker serving and the
connection's thread ends.

No timings are asserted: the timeouts below only turn a hang into a failure.
"""

from __future__ import annotations

import threading
import time

import pytest

from corral.rpc import connection as rpc_connection
from corral.rpc.client import RPCClient
from corral.worker.engines import EngineThread
from tests.unit.test_rpc_server import SECRET, runtime  # noqa: F401  (module fixture)

ENGINE_THREAD = "corral-engine_0"
GUARD = 30.0  # seconds: only a hang reaches it


def _call(method: str, *args) -> dict:
    return {"engine_name": "main", "method": method, "args": list(args), "kwargs": {}}


def _conn_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "rpc-conn")


@pytest.fixture
def readers(monkeypatch):
    """The threads that processed each /call message (who read and checked it)."""
    seen: list[str] = []
    process = rpc_connection.Connection.process

    def recording(self, msg, lease=None, frame_nonce=None):
        if msg.path == "/call":
            seen.append(threading.current_thread().name)
        return process(self, msg, lease, frame_nonce)

    monkeypatch.setattr(rpc_connection.Connection, "process", recording)
    return seen


def test_calls_read_by_the_engine_thread_and_by_connection_threads_all_run_on_it(
    runtime,  # noqa: F811
    readers,
):
    """Two clients call at once, each on its own connection: the engine thread reads
    some requests itself (the connection was lent to it), connection threads read the
    others, and every method runs on the one engine thread."""
    names: list[str] = []
    errors: list[BaseException] = []

    def calls(client: RPCClient) -> None:
        try:
            for _ in range(150):
                names.append(
                    client.request(
                        runtime.test_address, "/call", _call("thread_name"), timeout=GUARD
                    )
                )
        except BaseException as exc:  # reported below
            errors.append(exc)

    clients = [RPCClient(SECRET), RPCClient(SECRET)]
    threads = [threading.Thread(target=calls, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(GUARD * 2)
    for c in clients:
        c.close()
    assert not errors, errors
    assert len(names) == 300
    assert set(names) == {ENGINE_THREAD}
    assert ENGINE_THREAD in readers, "no request was read by the engine thread (no lending)"
    assert set(readers) <= {ENGINE_THREAD, "rpc-conn"}


def test_a_call_on_another_connection_wakes_the_engine_thread_parked_on_the_first(
    runtime,  # noqa: F811
    monkeypatch,
):
    """Client A's call leaves the engine thread waiting on A's socket, here for up to 10
    minutes; client B's call must wake it, run and be answered, and A goes on after."""
    monkeypatch.setattr(rpc_connection, "PARK_SECONDS", 600.0)
    a, b = RPCClient(SECRET), RPCClient(SECRET)
    try:
        assert a.request(runtime.test_address, "/call", _call("thread_name")) == ENGINE_THREAD
        time.sleep(0.2)  # the engine thread parks on A's connection
        got = b.request(runtime.test_address, "/call", _call("echo", "from B"), timeout=GUARD)
        assert got == "from B"
        assert a.request(
            runtime.test_address, "/call", _call("echo", "A again"), timeout=GUARD
        ) == ("A again")
        assert b.request(runtime.test_address, "/call", _call("thread_name"), timeout=GUARD) == (
            ENGINE_THREAD
        )
    finally:
        a.close()
        b.close()


def test_a_client_that_times_out_on_a_lent_connection_leaves_the_worker_serving(
    runtime,  # noqa: F811
):
    """A's call outlives A's timeout (A closes its connection); the engine thread finishes
    it, finds the connection closed and gives it back: its thread ends; then calls on
    other connections (and on a new one of A's) are served."""
    a, b = RPCClient(SECRET), RPCClient(SECRET)
    try:
        assert b.request(runtime.test_address, "/call", _call("noop")) is None
        assert a.request(runtime.test_address, "/call", _call("noop")) is None  # lent now
        before = _conn_threads()  # A's and B's (and any other test's still open)
        with pytest.raises(TimeoutError):
            a.request(runtime.test_address, "/call", _call("slow_thread_name", 0.5), timeout=0.1)
        deadline = time.monotonic() + GUARD
        while _conn_threads() >= before and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _conn_threads() < before, "the timed-out connection's thread never ended"
        got = b.request(runtime.test_address, "/call", _call("thread_name"), timeout=GUARD)
        assert got == ENGINE_THREAD
        assert a.request(runtime.test_address, "/call", _call("echo", 7), timeout=GUARD) == 7
    finally:
        a.close()
        b.close()


class _Ran:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.thread = ""

    def run(self) -> None:
        self.thread = threading.current_thread().name
        self.done.set()

    def cancel(self) -> None:
        self.done.set()


def test_work_queued_while_the_engine_thread_is_parked_on_a_socket_wakes_it():
    """``EngineThread.park`` (waiting 10 minutes on a socket nobody writes to) returns as
    soon as a task is queued, and the task runs on the engine thread."""
    import socket

    quiet, other = socket.socketpair()
    engine = EngineThread()
    parked = threading.Event()
    woke: list[bool] = []

    class Park:
        def run(self) -> None:
            parked.set()
            woke.append(engine.park(quiet.fileno(), 600.0))

        def cancel(self) -> None:
            pass

    try:
        engine.submit(Park())
        assert parked.wait(GUARD)
        time.sleep(0.1)  # inside poll by now (and if not, park sees the queue first)
        task = _Ran()
        engine.submit(task)
        assert task.done.wait(GUARD), "queued work did not wake the parked engine thread"
        assert woke == [False] and task.thread == ENGINE_THREAD
        other.sendall(b"x")  # readable now: park says so
        assert engine.run(lambda: engine.park(quiet.fileno(), GUARD)) is True
    finally:
        engine.close()
        quiet.close()
        other.close()


def test_a_duplicate_read_by_the_engine_thread_while_its_first_attempt_runs_gets_its_reply(
    runtime,  # noqa: F811
    readers,
):
    """Request R (a coroutine method, 1 s) runs for connection C; the same R arrives on a
    connection lent to the engine thread. The engine thread must not wait for R itself
    (``ResultCache.begin(wait=False)``): R's reply is waited for on the pool and sent."""
    from corral.rpc.protocol import new_request_id

    rid = new_request_id()
    c, lent = RPCClient(SECRET), RPCClient(SECRET)
    first: list = []
    try:
        worker = threading.Thread(
            target=lambda: first.append(
                c.request(
                    runtime.test_address,
                    "/call",
                    _call("async_echo", "R's value", 1.0),
                    request_id=rid,
                    timeout=GUARD,
                )  # fmt: skip
            )
        )
        worker.start()
        time.sleep(0.3)  # R runs now (on the event loop)
        assert lent.request(runtime.test_address, "/call", _call("noop")) is None  # lent now
        readers.clear()
        again = lent.request(
            runtime.test_address, "/call", _call("async_echo", "R's value", 1.0),
            request_id=rid, timeout=GUARD,
        )  # fmt: skip
        worker.join(GUARD)
        assert first == ["R's value"] and again == "R's value"
        assert readers == [ENGINE_THREAD]  # the duplicate was read on the engine thread
    finally:
        c.close()
        lent.close()
