"""Binary frames on one-request-at-a-time connections (corral.rpc.frames, issue 29): the
blocking client and the connection lent to the engine thread, on a real in-process worker.

The blocking client offers frames (``x-corral-frames: b1``) on its text requests and sends
its small requests as frames once a verified reply frame came back. On a lent connection
the engine thread reads and checks request frames itself. What must hold there as on the
pipelined connections: a tampered, unsigned, wrong-key or replayed frame is refused (401,
connection closed, the method not run); a frame on a connection that did not offer frames
is not served; the client refuses a reply frame not bound to its request; the next request
still proves the last reply's delivery; large requests go as text and frames resume.
"""

from __future__ import annotations

import socket
import threading
import uuid

import pytest

from corral.auth import AUTH_HEADER, RequestSigner, TrialKeys, sign_request_head
from corral.errors import AuthenticationError
from corral.rpc import connection as rpc_connection
from corral.rpc import frames, wire
from corral.rpc.client import RPCClient
from corral.rpc.http import REQUEST_ID_HEADER, SocketReader
from corral.rpc.server import RPCServer
from tests.unit.test_rpc_server import SECRET, runtime  # noqa: F401  (module fixture)

ENGINE_THREAD = "corral-engine_0"


def _call(method: str, *args) -> dict:
    return {"engine_name": "main", "method": method, "args": list(args), "kwargs": {}}


def _rid() -> str:
    return uuid.uuid4().hex


@pytest.fixture
def held(monkeypatch):
    """The engine thread keeps a lent connection while these tests think (no timing)."""
    monkeypatch.setattr(rpc_connection, "PARK_SECONDS", 30.0)


@pytest.fixture
def seen(monkeypatch):
    """Which thread processed each framed /call (``process`` with a frame nonce) and which
    refused a request (``RPCServer.refuse``)."""
    record: dict[str, list[str]] = {"frames": [], "refused": []}
    process = rpc_connection.Connection.process
    refuse = RPCServer.refuse

    def processing(self, msg, lease=None, frame_nonce=None):
        if frame_nonce is not None and msg.path == "/call":
            record["frames"].append(threading.current_thread().name)
        return process(self, msg, lease, frame_nonce)

    def refusing(self, conn, why, wlock):
        record["refused"].append(threading.current_thread().name)
        return refuse(self, conn, why, wlock)

    monkeypatch.setattr(rpc_connection.Connection, "process", processing)
    monkeypatch.setattr(RPCServer, "refuse", refusing)
    return record


def _text_request(payload: dict, request_id: str, offer: bool = True) -> bytes:
    body = wire.encode_bytes(payload)
    auth = sign_request_head(SECRET, "POST", "/call", body, request_id=request_id)
    offered = f"{frames.OFFER_HEADER}: {frames.OFFER}\r\n" if offer else ""
    head = (
        f"POST /call HTTP/1.1\r\nHost: t\r\nContent-Type: application/x-corral-frame\r\n"
        f"{REQUEST_ID_HEADER}: {request_id}\r\n{offered}{AUTH_HEADER}: {auth}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


class _Lent:
    """A raw one-request-at-a-time connection that offered frames with a signed text
    engine call: its reply (a frame) came from the engine thread, which now holds it."""

    def __init__(self, address: str, offer: bool = True):
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        self.keys = TrialKeys(SECRET)
        self.signer = RequestSigner(self.keys)
        self.reader = SocketReader(self.sock)
        self.sock.sendall(_text_request(_call("echo", "first"), _rid(), offer))
        # the nonce of that text request is inside sign_request_head's own signer: the
        # reply is read whole, only its kind checked
        first = self.reader.peek(30)
        assert (first == frames.FRAME_BYTE) is offer, first
        if offer:
            frames.read_reply(self.reader)
        else:
            head = self.reader.read_head()
            self.reader.read_body(head.content_length)

    def frame(self, payload: dict, request_id: str | None = None) -> tuple[bytes, str]:
        body = wire.encode_bytes(payload)
        return frames.request_frame(self.signer, "/call", request_id or _rid(), "", body)

    def reply(self, nonce: str):
        assert self.reader.peek(30) == frames.FRAME_BYTE
        return frames.open_reply(self.keys, "test", frames.read_reply(self.reader), nonce)

    def refused(self) -> str:
        """The worker's answer, which must be a 401 text reply that closes the connection."""
        head = self.reader.read_head()
        assert head is not None and head.status == 401, head
        text = bytes(self.reader.read_body(head.content_length)).decode()
        assert self.sock.recv(1) == b""  # closed
        return text

    def close(self) -> None:
        self.sock.close()


def test_the_blocking_client_sends_frames_once_a_reply_frame_came(
    runtime,  # noqa: F811
    seen,
    monkeypatch,
):
    sent: list[str] = []
    request_frame = frames.request_frame

    def counting(signer, path, request_id, identity, body):
        sent.append(request_id)
        return request_frame(signer, path, request_id, identity, body)

    monkeypatch.setattr(frames, "request_frame", counting)
    client = RPCClient(SECRET)
    try:
        results = [
            client.request(runtime.test_address, "/call", _call("echo", i), request_id=f"bf{i}")
            for i in range(6)
        ]
    finally:
        client.close()
    assert results == list(range(6))
    # the first reply answers the shared-memory offer (a text head), the second is a frame:
    # from the third request on, frames
    assert sent == [f"bf{i}" for i in range(2, 6)]
    assert len(seen["frames"]) == 4 and seen["refused"] == []


def test_the_engine_thread_reads_request_frames_on_a_lent_connection(runtime, held, seen):  # noqa: F811
    conn = _Lent(runtime.test_address)
    for value in ("a", "b", "c"):
        data, nonce = conn.frame(_call("echo", value))
        conn.sock.sendall(data)
        reply = conn.reply(nonce)
        assert wire.decode(reply.body) == {"ok": True, "result": value}
    assert seen["frames"] == [ENGINE_THREAD] * 3
    conn.close()


def _tamper(conn: _Lent, data: bytes, how: str) -> bytes:
    frame = bytearray(data)
    head_len = int.from_bytes(frame[2:4], "big")
    head = bytes(frame[frames.HEAD_START : frames.HEAD_START + head_len])
    body = bytes(frame[frames.HEAD_START + head_len :])
    if how == "unsigned":
        return bytes(frame[:8]) + bytes(32) + bytes(frame[frames.HEAD_START :])
    if how == "wrong key":  # the text request key: a valid MAC, for another use
        mac = conn.keys.mac(conn.keys.request, bytes(frame[:8]), head, body)
        return bytes(frame[:8]) + mac + bytes(frame[frames.HEAD_START :])
    if how == "other secret":
        other = TrialKeys(SECRET[:-1] + "b")
        mac = other.mac(other.frame_request, bytes(frame[:8]), head, body)
        return bytes(frame[:8]) + mac + bytes(frame[frames.HEAD_START :])
    # the head's last byte (its timestamp): an altered path is not lendable, and its own
    # thread refuses it (test_wire_frames)
    at = {"head": frames.HEAD_START + head_len - 1, "body": len(frame) - 3, "mac": 8 + 5}[how]
    frame[at] ^= 0x01
    return bytes(frame)


@pytest.mark.parametrize("how", ["head", "body", "mac", "unsigned", "wrong key", "other secret"])
def test_a_bad_frame_on_a_lent_connection_is_refused_by_the_engine_thread_and_not_run(
    runtime,  # noqa: F811
    held,
    seen,
    how,
):
    conn = _Lent(runtime.test_address)
    rid = _rid()
    data, _nonce = conn.frame(_call("echo", "bad"), rid)
    conn.sock.sendall(_tamper(conn, data, how))
    assert "wrong frame MAC" in conn.refused()
    assert seen["refused"] == [ENGINE_THREAD] and seen["frames"] == []
    assert runtime.cache.begin(rid) is None  # the request never reached the cache
    conn.close()


def test_a_replayed_frame_on_a_lent_connection_is_refused_and_not_run_twice(
    runtime,  # noqa: F811
    held,
    seen,
):
    count = RPCClient(SECRET)
    before = count.request(runtime.test_address, "/call", _call("count"))
    conn = _Lent(runtime.test_address)  # its first request runs echo once
    data, nonce = conn.frame(_call("echo", "once"))
    conn.sock.sendall(data)
    assert wire.decode(conn.reply(nonce).body)["result"] == "once"
    conn.sock.sendall(data)  # byte for byte, same connection, read by the engine thread
    assert "nonce seen before" in conn.refused()
    assert seen["refused"] == [ENGINE_THREAD]
    conn.close()
    assert count.request(runtime.test_address, "/call", _call("count")) == before + 2
    count.close()


def test_a_frame_on_a_connection_that_did_not_offer_frames_is_not_served(
    runtime,  # noqa: F811
    held,
    seen,
):
    conn = _Lent(runtime.test_address, offer=False)
    rid = _rid()
    data, _nonce = conn.frame(_call("echo", "unoffered"), rid)
    conn.sock.sendall(data + b"\r\n\r\n")  # so that its own thread reads it as a head at once
    answer = b""
    try:
        while chunk := conn.sock.recv(65536):
            answer += chunk
    except ConnectionError:
        pass
    assert answer.startswith(b"HTTP/1.1 400"), answer[:60]  # not a request: not served
    assert seen["frames"] == [] and runtime.cache.begin(rid) is None
    conn.close()


def test_the_blocking_client_refuses_a_reply_frame_not_bound_to_its_request(
    runtime,  # noqa: F811
    monkeypatch,
):
    original = frames.send_reply

    def unbound(conn, keys, reply, nonce, request_id, local):
        return original(conn, keys, reply, nonce + "0", request_id, local)

    client = RPCClient(SECRET)
    try:
        assert client.request(runtime.test_address, "/call", _call("echo", "before")) == "before"
        monkeypatch.setattr(frames, "send_reply", unbound)
        with pytest.raises(AuthenticationError, match="reply frame whose MAC is wrong"):
            client.request(runtime.test_address, "/call", _call("echo", "X"), timeout=10)
    finally:
        client.close()


def test_a_large_request_goes_as_text_and_frames_resume(runtime, seen):  # noqa: F811
    client = RPCClient(SECRET)
    big = bytes(range(256)) * (frames.MAX_BODY // 256 + 1)
    try:
        assert client.request(runtime.test_address, "/call", _call("echo", 0)) == 0
        assert client.request(runtime.test_address, "/call", _call("echo", 1)) == 1
        assert client.request(runtime.test_address, "/call", _call("echo", 2)) == 2
        assert client.request(runtime.test_address, "/call", _call("echo", big)) == big
        assert client.request(runtime.test_address, "/call", _call("echo", 3)) == 3
    finally:
        client.close()
    assert len(seen["frames"]) == 2  # the calls with 2 and 3; 0, 1 and the large one as text


def test_the_next_request_frame_proves_the_last_replys_delivery(runtime, monkeypatch):  # noqa: F811
    delivered: list[str] = []
    proven = RPCServer.delivered

    def recording(self, request_id):
        delivered.append(request_id)
        return proven(self, request_id)

    monkeypatch.setattr(RPCServer, "delivered", recording)
    client = RPCClient(SECRET)
    try:
        for i in range(4):
            client.request(runtime.test_address, "/call", _call("echo", i), request_id=f"dl{i}")
    finally:
        client.close()
    assert [r for r in delivered if r.startswith("dl")] == ["dl0", "dl1", "dl2"]
