"""The reply frames of a batch sent together (``rpc.unsent``, issue 29): one write while
the connection's thread watches them, one per call when it does not, and never a reply
held behind a later call that blocks, whether or not a watch is on when it is made."""

from __future__ import annotations

import threading

from corral.rpc.unsent import EMPTY_WAKES, Unsent
from corral.worker.engine_thread import Batch
from tests.unit.test_frame_batches import GATE, _replies, _send_together
from tests.unit.test_rpc_server import runtime  # noqa: F401  (module fixture)
from tests.unit.test_wire_frames import _call, _Conn


class _Sock:
    """Records each write."""

    def __init__(self):
        self.writes: list[bytes] = []

    def sendall(self, data: bytes) -> None:
        self.writes.append(bytes(data))


class _Reply:
    """A batch's task: appends its reply frame, as an engine call's reply does."""

    def __init__(self, unsent: Unsent, frame: bytes):
        self.unsent, self.frame = unsent, frame

    def run(self) -> None:
        self.unsent.append(self.frame)


def _batch(watching: bool) -> list[bytes]:
    sock = _Sock()
    unsent = Unsent(sock, threading.Lock())  # type: ignore[arg-type]
    unsent.watching = watching
    Batch([_Reply(unsent, f"r{i};".encode()) for i in range(4)], unsent.settle).run()
    return sock.writes


def test_a_watched_batch_sends_its_replies_in_one_write_after_its_last_call():
    assert _batch(watching=True) == [b"r0;r1;r2;r3;"]


def test_an_unwatched_batch_sends_each_reply_after_its_call():
    assert _batch(watching=False) == [b"r0;", b"r1;", b"r2;", b"r3;"]


def test_a_reply_made_after_the_watch_ended_does_not_wait_for_a_blocking_call(
    runtime,  # noqa: F811
):
    """A long call first (the watch ends: ``EMPTY_WAKES`` wakes found nothing to send),
    then a quick one, then one that blocks until the test has the quick one's reply: the
    engine thread must send that reply itself (were it left for a watch that is over,
    the read would time out)."""
    if "gate" not in runtime.engines.engines:
        runtime.engines.create("gate", "tests.unit.test_frame_batches.GateEngine", [], {})
    GATE.clear()
    conn = _Conn(runtime.test_address)
    conn.sock.settimeout(20)  # not a timing assertion: a reply held until GATE is set
    long_call = _call("slow_thread_name", 0.05 + EMPTY_WAKES * 0.01)
    gate = {"engine_name": "gate", "method": "wait", "args": [], "kwargs": {}}
    rids, nonces = _send_together(conn, [long_call, _call("echo", "quick"), gate])
    try:
        got = _replies(conn, {rid: nonces[rid] for rid in rids[:2]}, 2)
    finally:
        GATE.set()
    assert got[rids[1]] == "quick"
    assert _replies(conn, {rids[2]: nonces[rids[2]]}, 1) == {rids[2]: "opened"}
    conn.close()
