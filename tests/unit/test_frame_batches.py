"""Batches of pipelined frames (issue 29) on a real in-process worker.

The request frames that one receive brings are handled as one batch: each is verified and
replay-checked on its own, the engine calls among them reach the engine thread together
and run there in arrival order, and their replies leave together. What must hold: order,
the one engine thread, an error answering only its own call, a tampered frame refused
without running the frames after it, and a reply that does not wait for a slow call
behind it in its batch.
"""

from __future__ import annotations

import threading

from corral.errors import EngineCallError
from corral.rpc import frames, wire
from corral.rpc.protocol import interpret_reply
from tests.unit.test_rpc_server import SECRET, runtime  # noqa: F401  (module fixture)
from tests.unit.test_wire_frames import _call, _Conn, _rid

#: set by the test that holds ``GateEngine.wait`` (the engine is made in this process)
GATE = threading.Event()


class GateEngine:
    """An engine whose ``wait`` returns only once the test opens ``GATE``."""

    def wait(self) -> str:
        return "opened" if GATE.wait(60) else "timed out"


def _replies(
    conn: _Conn, nonces: dict[str, str], count: int, buf: bytearray | None = None
) -> dict[str, object]:
    """``count`` reply frames, each opened with its request's nonce: result by request id
    (or the remote error raised). ``buf``: what was received and not yet read (what came
    after those replies is left there)."""
    buf = bytearray() if buf is None else buf
    out = {}
    while len(out) < count:
        while len(buf) < frames.HEAD_START or len(buf) < frames.reply_size(buf):
            chunk = conn.sock.recv(65536)
            assert chunk, "the worker closed the connection instead of answering"
            buf += chunk
        size = frames.reply_size(buf)
        frame = buf[:size]
        del buf[:size]
        _status, rid, _kind, _start = frames.reply_head(frame)
        msg = frames.open_reply(conn.keys, "test", frame, nonces[rid])
        try:
            out[rid] = interpret_reply("test", msg)
        except EngineCallError as exc:
            out[rid] = exc
    return out


def _send_together(conn: _Conn, payloads: list[dict]) -> tuple[list[str], dict[str, str]]:
    """Frames for ``payloads``, sent in one write (so one receive brings them all)."""
    rids, nonces, data = [], {}, []
    for payload in payloads:
        rid = _rid()
        frame, nonces[rid] = conn.frame(payload, rid)
        rids.append(rid)
        data.append(frame)
    conn.sock.sendall(b"".join(data))
    return rids, nonces


def test_frames_of_one_write_run_in_order_on_the_engine_thread(runtime):  # noqa: F811
    conn = _Conn(runtime.test_address)
    start = runtime.engines.call("main", "count", [], {})
    payloads = []
    for i in range(60):  # each echo counts one; count says how many ran before it
        payloads += [_call("echo", i), _call("count"), _call("thread_name")]
    rids, nonces = _send_together(conn, payloads)
    got = _replies(conn, nonces, len(rids))
    results = [got[rid] for rid in rids]
    assert results[0::3] == list(range(60))
    assert results[1::3] == [start + i + 1 for i in range(60)]  # in arrival order
    assert set(results[2::3]) == {"corral-engine_0"}
    conn.close()


def test_an_error_in_the_middle_of_a_batch_answers_only_its_own_call(runtime):  # noqa: F811
    conn = _Conn(runtime.test_address)
    payloads = [_call("echo", "a"), _call("fail", "in the middle"), _call("echo", "c")]
    rids, nonces = _send_together(conn, payloads)
    got = _replies(conn, nonces, 3)
    assert got[rids[0]] == "a" and got[rids[2]] == "c"
    assert isinstance(got[rids[1]], EngineCallError) and "in the middle" in str(got[rids[1]])
    conn.close()


def test_a_tampered_frame_in_a_batch_is_refused_and_the_frames_after_it_do_not_run(
    runtime,  # noqa: F811
):
    conn = _Conn(runtime.test_address)
    rids, data, nonces = [_rid() for _ in range(3)], [], {}
    for i, rid in enumerate(rids):
        signed, nonces[rid] = conn.frame(_call("echo", f"frame {i}"), rid)
        frame = bytearray(signed)
        if i == 1:
            frame[-3] ^= 0x01  # its body altered after it was signed
        data.append(bytes(frame))
    conn.sock.sendall(b"".join(data))
    buf = bytearray()  # the 401 may come in the same receive as the reply
    assert _replies(conn, {rids[0]: nonces[rids[0]]}, 1, buf) == {rids[0]: "frame 0"}
    assert "wrong frame MAC" in conn.refused(buf)  # then the connection is closed
    first = runtime.cache.begin(rids[0])  # verified before the bad one: it ran
    assert first is not None and wire.decode(b"".join(first.parts))["result"] == "frame 0"
    assert runtime.cache.begin(rids[1]) is None  # never reached the cache
    assert runtime.cache.begin(rids[2]) is None  # read after the bad one: not run
    conn.close()


def test_a_reply_in_a_batch_does_not_wait_for_a_slow_call_behind_it(runtime):  # noqa: F811
    """The first call's reply must come while ``wait`` still runs (the
    test opens the gate only after it has that reply; were the reply held to the end of
    the batch, the read would time out)."""
    if "gate" not in runtime.engines.engines:
        runtime.engines.create("gate", f"{__name__}.GateEngine", [], {})
    GATE.clear()
    conn = _Conn(runtime.test_address)
    conn.sock.settimeout(20)
    gate = {"engine_name": "gate", "method": "wait", "args": [], "kwargs": {}}
    rids, nonces = _send_together(conn, [_call("echo", "quick"), gate])
    try:
        first = _replies(conn, {rids[0]: nonces[rids[0]]}, 1)
    finally:
        GATE.set()
    assert first == {rids[0]: "quick"}
    assert _replies(conn, {rids[1]: nonces[rids[1]]}, 1) == {rids[1]: "opened"}
    conn.close()


def test_the_same_request_id_twice_in_one_batch_is_answered_twice_not_deadlocked(
    runtime,  # noqa: F811
):
    """The second is a retry of the first, which is held back in the same batch: the
    connection's thread must not wait for it there (it would wait for itself)."""
    conn = _Conn(runtime.test_address)
    conn.sock.settimeout(20)
    rid = _rid()
    first, nonce1 = conn.frame(_call("echo", "once"), rid)
    second, nonce2 = conn.frame(_call("echo", "once"), rid)
    conn.sock.sendall(first + second)
    buf, results = bytearray(), []
    while len(results) < 2:
        while len(buf) < frames.HEAD_START or len(buf) < frames.reply_size(buf):
            chunk = conn.sock.recv(65536)
            assert chunk, "the worker closed the connection instead of answering"
            buf += chunk
        size = frames.reply_size(buf)
        frame = buf[:size]
        del buf[:size]
        nonce = nonce1 if len(results) == 0 else nonce2
        try:
            msg = frames.open_reply(conn.keys, "test", frame, nonce)
        except Exception:  # the answers may come in either order
            msg = frames.open_reply(conn.keys, "test", frame, nonce1 if nonce == nonce2 else nonce2)
        results.append(interpret_reply("test", msg))
    assert results == ["once", "once"]
    conn.close()
