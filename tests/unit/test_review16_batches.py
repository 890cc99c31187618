"""Review 16 (issue 29, fanout2): a frame refused in the middle of a batch.

security.md says a refused frame ends the connection "as it would alone: the frames
before it were verified and run". Alone, their replies would have been sent before the
bad frame was read; in a batch they are gathered for one write that the engine thread
makes after the connection's thread has already refused and closed the socket.
"""

from __future__ import annotations

import pytest

from corral.rpc import frames
from corral.rpc.http import SocketReader
from corral.rpc.protocol import interpret_reply
from tests.unit.test_rpc_server import runtime  # noqa: F401  (module fixture)
from tests.unit.test_wire_frames import _call, _Conn, _rid


@pytest.mark.xfail(
    strict=True,
    reason="review16 finding: _serve_frames refuses and closes before the engine thread "
    "flushes the batch, so the verified frames' replies are lost",
)
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
