"""Batches of pipelined frames (issue 29), two cases an adversarial review found: a frame
refused in the middle of a batch (the replies of the frames before it must still come,
as they would alone, before the 401), and a call that was quick last time but blocks now
(the replies before it must not wait for it: any call may block)."""

from __future__ import annotations

import threading

from corral.rpc import frames
from corral.rpc.http import SocketReader
from corral.rpc.protocol import interpret_reply
from tests.unit.test_frame_batches import _replies, _send_together
from tests.unit.test_rpc_server import runtime  # noqa: F401  (module fixture)
from tests.unit.test_wire_frames import _call, _Conn, _rid


def test_replies_of_frames_before_a_refused_one_in_a_batch_still_come(runtime):  # noqa: F811
    conn = _Conn(runtime.test_address)
    conn.sock.settimeout(20)
    rids, nonces, data = [_rid() for _ in range(3)], [], []
    for i, rid in enumerate(rids):
        frame, nonce = conn.frame(_call("echo", f"frame {i}"), rid)
        frame = bytearray(frame)
        if i == 1:
            frame[-3] ^= 0x01  # altered after it was signed
        nonces.append(nonce)
        data.append(bytes(frame))
    conn.sock.sendall(b"".join(data))
    reader = SocketReader(conn.sock)
    got = []
    while True:
        if not reader.pending:
            chunk = conn.sock.recv(65536)
            if not chunk:
                break
            reader.pending += chunk
        if reader.pending[0] == frames.FRAME_BYTE:
            frame = frames.read_reply(reader)
            msg = frames.open_reply(conn.keys, "test", frame, nonces[0])
            got.append(("frame", interpret_reply("test", msg)))
        else:
            head = reader.read_head()
            got.append(("text", head.status))
            reader.read_body(head.content_length)
    conn.close()
    # alone, frame 0's reply would come first, then the 401 for frame 1
    assert got == [("frame", "frame 0"), ("text", 401)], got


#: set by the test that holds ``SometimesSlow.wait``
OPEN = threading.Event()


class SometimesSlow:
    """An engine whose ``wait`` was quick last time and now waits for the test."""

    def wait(self) -> str:
        return "opened" if OPEN.wait(60) else "timed out"


def test_a_reply_in_a_batch_does_not_wait_for_a_call_that_was_quick_last_time(
    runtime,  # noqa: F811
):
    if "sometimes" not in runtime.engines.engines:
        runtime.engines.create("sometimes", f"{__name__}.SometimesSlow", [], {})
    sometimes = {"engine_name": "sometimes", "method": "wait", "args": [], "kwargs": {}}
    OPEN.set()
    warm = _Conn(runtime.test_address)
    warm_rids, warm_nonces = _send_together(warm, [sometimes])
    assert _replies(warm, warm_nonces, 1) == {warm_rids[0]: "opened"}  # quick this time
    warm.close()
    OPEN.clear()
    conn = _Conn(runtime.test_address)
    conn.sock.settimeout(20)  # not a timing assertion: a reply held until OPEN is set
    slow = {"engine_name": "sometimes", "method": "wait", "args": [], "kwargs": {}}
    rids, nonces = _send_together(conn, [_call("echo", "quick"), slow])
    try:
        first = _replies(conn, {rids[0]: nonces[rids[0]]}, 1)
    finally:
        OPEN.set()
    assert first == {rids[0]: "quick"}
    conn.close()
