"""The blocking engine call's short path (issue 29, noop): what it leaves out must not change
what a call does.

On a connection lent to the engine thread, a synchronous engine call runs right there when
nothing is queued (no task queued for it), and goes through the queue otherwise; the
controller's first attempt skips ``Caller._call`` but retries exactly as it did, with the
same request id; the client reads a reply frame into its fields (``frames.reply_fields``)
with the same checks as ``frames.open_reply``; empty arguments encode as before.
"""

from __future__ import annotations

import pytest

from corral.auth import TrialKeys
from corral.controller.caller import Caller, CallOptions
from corral.errors import AuthenticationError, WorkerConnectionError
from corral.rpc import frames, wire
from corral.rpc.client import RPCClient, WorkerUnreachableError
from corral.rpc.reply import Reply
from corral.spec import Worker
from corral.worker.engines import EngineHost
from tests.unit.test_blocking_frames import ENGINE_THREAD, _call
from tests.unit.test_rpc_server import SECRET, runtime  # noqa: F401  (module fixture)


@pytest.fixture
def queued(monkeypatch):
    """The tasks queued for the engine thread (``EngineHost.submit``)."""
    tasks: list = []
    submit = EngineHost.submit

    def counting(self, task):
        tasks.append(task)
        return submit(self, task)

    monkeypatch.setattr(EngineHost, "submit", counting)
    return tasks


def _calls(address: str, n: int) -> list:
    client = RPCClient(SECRET)
    try:
        client.request(address, "/call", _call("noop"))  # the text offer, then frames
        client.request(address, "/call", _call("noop"))
        return [client.request(address, "/call", _call("thread_name")) for _ in range(n)]
    finally:
        client.close()


def test_a_call_read_on_the_lent_connection_runs_there_without_a_queued_task(
    runtime,  # noqa: F811
    queued,
):
    assert _calls(runtime.test_address, 5) == [ENGINE_THREAD] * 5
    assert len(queued) <= 2, f"calls read by the engine thread went through its queue: {queued}"


def test_with_work_queued_a_call_read_on_the_lent_connection_waits_its_turn(
    runtime,  # noqa: F811
    queued,
    monkeypatch,
):
    monkeypatch.setattr(runtime.engines, "idle", lambda: False)
    assert _calls(runtime.test_address, 5) == [ENGINE_THREAD] * 5
    assert len(queued) == 7


class _Flaky:
    """An RPCClient whose first ``fails`` requests break; it records each request id."""

    def __init__(self, fails: int):
        self.fails, self.ids, self.forgotten = fails, [], 0

    def request(self, address, path, payload, *, timeout=None, request_id=None, identity=None):
        self.ids.append(request_id)
        if len(self.ids) <= self.fails:
            raise WorkerUnreachableError(address, ConnectionResetError("cut"))
        return "done"

    def forget(self, address):
        self.forgotten += 1


def _caller(client: _Flaky) -> Caller:
    caller = Caller(SECRET, diagnose=lambda worker, cause: None)
    caller.client.close()
    caller.client = client
    return caller


WORKER = Worker(id="r/0", ip="127.0.0.1", port=1)


@pytest.mark.parametrize("fails", [1, 2])
def test_a_broken_first_attempt_is_retried_with_the_same_request_id(fails: int):
    client = _Flaky(fails)
    assert _caller(client).call_engine(WORKER, "m", {}, CallOptions(None, 2, 0.0)) == "done"
    assert len(client.ids) == fails + 1 and len(set(client.ids)) == 1
    assert client.forgotten == fails


def test_with_one_attempt_a_broken_call_is_not_retried():
    client = _Flaky(1)
    with pytest.raises(WorkerConnectionError, match="broke 1 time"):
        _caller(client).call_engine(WORKER, "m", {}, CallOptions(None, 0, 0.0))
    assert len(client.ids) == 1


def test_attempts_run_out_after_every_retry():
    client = _Flaky(5)
    with pytest.raises(WorkerConnectionError, match="broke 3 time"):
        _caller(client).call_engine(WORKER, "m", {}, CallOptions(None, 2, 0.0))
    assert len(client.ids) == 3 and len(set(client.ids)) == 1


def _reply_frame(keys: TrialKeys, nonce: str, body: bytes = b"result") -> bytearray:
    out: list = []
    assert frames.reply_frame(out, keys, Reply(200, [body], "x/y"), nonce, "rid", None)
    return bytearray(out[0])


def test_reply_fields_are_those_of_open_reply():
    keys = TrialKeys(SECRET)
    frame = _reply_frame(keys, "c-1")
    status, content_type, body = frames.reply_fields(keys, "a", bytearray(frame), "c-1")
    msg = frames.open_reply(keys, "a", bytearray(frame), "c-1")
    assert (status, content_type, bytes(body)) == (200, "x/y", b"result")
    assert (msg.status, msg.headers["content-type"], bytes(msg.body)) == (200, "x/y", b"result")


@pytest.mark.parametrize("how", ["nonce", "body", "head", "key"])
def test_reply_fields_refuse_what_open_reply_refuses(how: str):
    keys = TrialKeys(SECRET)
    frame, nonce = _reply_frame(keys, "c-1"), "c-1"
    if how == "nonce":
        nonce = "c-2"  # another request's
    elif how == "body":
        frame[-1] ^= 1
    elif how == "head":
        frame[frames.HEAD_START] ^= 1
    else:
        keys = TrialKeys("another secret")
    with pytest.raises(AuthenticationError, match="MAC is wrong"):
        frames.reply_fields(keys, "a", frame, nonce)


@pytest.mark.parametrize(
    "payload",
    [
        {"engine_name": None, "method": "noop", "args": [], "kwargs": {}},
        {"a": [], "b": {}, "c": [1, (2,)], "d": {"x": ()}, "e": [[]]},
    ],
)
def test_empty_arguments_encode_and_decode_as_before(payload: dict):
    data = wire.encode_bytes(payload)
    assert wire.decode(data) == payload
    assert b'"args":[]' in data or b'"a":[]' in data


def test_the_result_cache_counts_each_reply_once_and_drops_a_delivered_large_one():
    from corral.worker import result_cache
    from corral.worker.result_cache import LARGE_REPLY_BYTES, ResultCache

    cache = ResultCache()
    small, big = Reply(200, [b"x" * 10]), Reply(200, [memoryview(bytearray(LARGE_REPLY_BYTES))])
    for rid, reply in (("a", small), ("b", big)):
        assert cache.begin(rid) is None
        cache.finish(rid, reply)
    assert cache._bytes == 10 + LARGE_REPLY_BYTES
    cache.delivered("a")  # small: kept for a retry
    cache.delivered("b")  # large and delivered: dropped, a duplicate refused
    assert cache.begin("a") is small and cache.begin("b").status == 410
    assert cache._bytes == 10
    for i in range(result_cache.RESULT_CACHE_ENTRIES + 5):
        cache.begin(f"n{i}")
        cache.finish(f"n{i}", Reply(200, [b"y" * 3]))
    assert cache._bytes == 3 * result_cache.RESULT_CACHE_ENTRIES
    assert cache.begin("a") is None  # evicted: it would run again


def test_a_lent_frame_for_another_worker_is_refused_and_not_run(runtime, monkeypatch):  # noqa: F811
    from corral.rpc import connection as rpc_connection
    from tests.unit.test_blocking_frames import _Lent, _rid

    monkeypatch.setattr(rpc_connection, "PARK_SECONDS", 30.0)  # the engine thread holds it
    conn = _Lent(runtime.test_address)
    try:
        count = runtime.engines.engines["main"].calls
        body = wire.encode_bytes(_call("echo", "not me"))
        data, _ = frames.request_frame(conn.signer, "/call", _rid(), "host/0#stale", body)
        conn.sock.sendall(data)
        head = conn.reader.read_head()
        assert head.status == 409 and b"stale" in bytes(conn.reader.read_body(head.content_length))
        assert conn.sock.recv(1) == b""  # closed
        assert runtime.engines.engines["main"].calls == count
    finally:
        conn.close()
