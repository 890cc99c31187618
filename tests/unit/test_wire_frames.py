"""The binary frame of pipelined connections (corral.rpc.frames, issue 29) on a real
in-process worker: red-team cases.

A frame is refused (401, connection closed, the method not run) when its head or body was
altered, when its MAC is missing or made with another key, when its nonce was seen before,
when its timestamp is stale, and on a connection that has not first carried a signed text
request offering frames. On the client, a reply frame is accepted only if its MAC binds it
to the nonce of the request it answers. Calls give the same results with frames and with
text heads only.
"""

from __future__ import annotations

import asyncio
import socket
import time
import uuid

import pytest

from corral.auth import AUTH_HEADER, RequestSigner, TrialKeys, sign_request_head
from corral.errors import AuthenticationError, EngineCallError
from corral.rpc import frames, wire
from corral.rpc.client import AsyncRPCClient
from corral.rpc.http import PIPELINE_HEADER, REQUEST_ID_HEADER, SocketReader
from tests.unit.test_rpc_server import SECRET, runtime  # noqa: F401  (module fixture)


def _call(method: str, *args) -> dict:
    return {"engine_name": "main", "method": method, "args": list(args), "kwargs": {}}


def _rid() -> str:
    return uuid.uuid4().hex


def _text_request(payload: dict, request_id: str, offer: str = frames.OFFER) -> bytes:
    body = wire.encode_bytes(payload)
    auth = sign_request_head(SECRET, "POST", "/call", body, request_id=request_id)
    head = (
        f"POST /call HTTP/1.1\r\nHost: t\r\nContent-Type: application/x-corral-frame\r\n"
        f"{REQUEST_ID_HEADER}: {request_id}\r\n{PIPELINE_HEADER}: {offer}\r\n"
        f"{AUTH_HEADER}: {auth}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def _read_reply_frame(sock: socket.socket, keys: TrialKeys, nonce: str):
    """The next reply, which must be a frame, opened with ``nonce``."""
    buf = bytearray()
    while len(buf) < frames.HEAD_START or len(buf) < frames.reply_size(buf):
        chunk = sock.recv(65536)
        assert chunk, "the worker closed the connection instead of answering"
        buf += chunk
    assert buf[0] == frames.FRAME_BYTE, bytes(buf[:40])
    return frames.open_reply(keys, "test", buf, nonce)


class _Conn:
    """A raw connection that has offered frames with a signed text request."""

    def __init__(self, address: str):
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        self.keys = TrialKeys(SECRET)
        self.signer = RequestSigner(self.keys)
        self.sock.sendall(_text_request(_call("echo", "first"), _rid()))
        # the reply to an offering text request comes as a frame already; its nonce is
        # inside sign_request_head's own signer, so only its kind is checked here
        head = self.sock.recv(1)
        assert head == bytes((frames.FRAME_BYTE,))
        self.sock.settimeout(0.5)
        try:
            while self.sock.recv(65536):
                pass
        except TimeoutError:
            pass
        self.sock.settimeout(30)

    def frame(self, payload: dict, request_id: str | None = None) -> tuple[bytes, str]:
        body = wire.encode_bytes(payload)
        return frames.request_frame(self.signer, "/call", request_id or _rid(), "", body)

    def refused(self, received: bytes | bytearray = b"") -> str:
        """The worker's answer, which must be a 401 text reply that closes the connection.
        ``received``: what of it was received already."""
        reader = SocketReader(self.sock)
        reader.pending += received
        head = reader.read_head()
        assert head is not None and head.status == 401, head
        text = bytes(reader.read_body(head.content_length)).decode()
        assert self.sock.recv(1) == b""  # closed
        return text

    def close(self) -> None:
        self.sock.close()


def test_calls_give_the_same_results_with_frames_and_with_text_heads(runtime):  # noqa: F811
    results = {}
    for offer in (True, False):
        client = AsyncRPCClient(SECRET, frames=offer)

        async def go(c=client):
            first = await c.request(runtime.test_address, "/call", _call("echo", -1))
            rest = await asyncio.gather(
                *(c.request(runtime.test_address, "/call", _call("echo", i)) for i in range(50))
            )
            return [first, *rest], c._pool(runtime.test_address).pipe.framed

        results[offer] = asyncio.run(go())
        client.close()
    assert results[True] == (list(range(-1, 50)), True)  # frames came back and were used
    assert results[False] == (list(range(-1, 50)), False)  # never offered: text only


def test_a_valid_frame_is_answered_with_a_frame(runtime):  # noqa: F811
    conn = _Conn(runtime.test_address)
    data, nonce = conn.frame(_call("echo", 41))
    conn.sock.sendall(data)
    reply = _read_reply_frame(conn.sock, conn.keys, nonce)
    assert reply.status == 200 and wire.decode(reply.body) == {"ok": True, "result": 41}
    conn.close()


@pytest.mark.parametrize("where", ["head", "body", "mac"])
def test_a_tampered_frame_is_refused_and_not_run(runtime, where):  # noqa: F811
    conn = _Conn(runtime.test_address)
    rid = _rid()
    data, _nonce = conn.frame(_call("echo", "tampered"), rid)
    frame = bytearray(data)
    head_len = int.from_bytes(frame[2:4], "big")
    at = {"head": frames.HEAD_START + 1, "body": len(frame) - 3, "mac": 8 + 5}[where]
    assert where != "head" or at < frames.HEAD_START + head_len
    frame[at] ^= 0x01
    conn.sock.sendall(bytes(frame))
    assert "wrong frame MAC" in conn.refused()
    assert runtime.cache.begin(rid) is None  # the request never reached the cache
    conn.close()


def test_an_unsigned_frame_is_refused(runtime):  # noqa: F811
    conn = _Conn(runtime.test_address)
    data, _nonce = conn.frame(_call("echo", 1))
    unsigned = data[:8] + bytes(32) + data[frames.HEAD_START :]
    conn.sock.sendall(unsigned)
    assert "wrong frame MAC" in conn.refused()
    conn.close()


def test_a_frame_signed_with_the_text_request_key_is_refused(runtime):  # noqa: F811
    conn = _Conn(runtime.test_address)
    data, _nonce = conn.frame(_call("echo", 1))
    head_len = int.from_bytes(data[2:4], "big")
    head, body = (
        data[frames.HEAD_START : frames.HEAD_START + head_len],
        data[frames.HEAD_START + head_len :],
    )
    other = conn.keys.mac(conn.keys.request, data[:8], head, body)  # the wrong key
    conn.sock.sendall(data[:8] + other + data[frames.HEAD_START :])
    assert "wrong frame MAC" in conn.refused()
    conn.close()


def test_a_replayed_frame_is_refused(runtime):  # noqa: F811
    conn = _Conn(runtime.test_address)
    data, nonce = conn.frame(_call("echo", "once"))
    conn.sock.sendall(data)
    _read_reply_frame(conn.sock, conn.keys, nonce)
    conn.sock.sendall(data)  # byte for byte, same connection
    assert "nonce seen before" in conn.refused()
    conn.close()
    other = _Conn(runtime.test_address)  # and on another connection
    other.sock.sendall(data)
    assert "nonce seen before" in other.refused()
    other.close()


def test_a_frame_with_a_stale_timestamp_is_refused(runtime, monkeypatch):  # noqa: F811
    conn = _Conn(runtime.test_address)
    real = time.time
    monkeypatch.setattr(frames.time, "time", lambda: real() - 600)
    data, _nonce = conn.frame(_call("echo", 1))
    monkeypatch.setattr(frames.time, "time", real)
    conn.sock.sendall(data)
    assert "off this host's clock" in conn.refused()
    conn.close()


def test_a_frame_before_any_signed_text_request_is_not_served(runtime):  # noqa: F811
    """Frames are taken only after a signed text request offered them: as the first bytes
    of a connection (here followed by a blank line, so the gate hands it on) a frame is
    not a request at all."""
    host, port = runtime.test_address.rsplit(":", 1)
    keys = TrialKeys(SECRET)
    body = wire.encode_bytes(_call("echo", "early"))
    data, _nonce = frames.request_frame(RequestSigner(keys), "/call", _rid(), "", body)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(data + b"\r\n\r\n")
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except ConnectionError:
            pass
    assert not answer.startswith(bytes((frames.FRAME_BYTE,))), answer[:60]  # not served
    assert answer == b"" or answer.startswith((b"HTTP/1.1 400", b"HTTP/1.1 401")), answer[:60]


def test_a_reply_frame_not_bound_to_its_request_is_refused(runtime, monkeypatch):  # noqa: F811
    """The worker (here: made to) sign a reply frame with another nonce than its request's:
    the client refuses it, never returns its result."""
    original = frames.send_reply

    def unbound(conn, keys, reply, nonce, request_id, local):
        return original(conn, keys, reply, nonce + "0", request_id, local)

    client = AsyncRPCClient(SECRET)

    async def go():
        await client.request(runtime.test_address, "/call", _call("echo", "before"))
        monkeypatch.setattr(frames, "send_reply", unbound)
        return await asyncio.gather(
            client.request(runtime.test_address, "/call", _call("echo", "X"), timeout=5),
            return_exceptions=True,
        )

    results = asyncio.run(go())
    assert "X" not in results and isinstance(results[0], AuthenticationError), results
    client.close()


def test_open_reply_refuses_another_nonce_and_an_altered_frame() -> None:
    keys = TrialKeys(SECRET)

    class Sink:
        data = b""

        def sendall(self, data: bytes) -> None:
            self.data = data

    class FakeReplyForTest:  # the attributes of rpc.server.Reply that frames reads
        status, parts, content_type, segment = 200, [b"result"], "text/plain", None

    sink = Sink()
    assert frames.send_reply(sink, keys, FakeReplyForTest(), "c-1", "rid", None)
    assert bytes(frames.open_reply(keys, "a", bytearray(sink.data), "c-1").body) == b"result"
    with pytest.raises(AuthenticationError):
        frames.open_reply(keys, "a", bytearray(sink.data), "c-2")  # another request's nonce
    altered = bytearray(sink.data)
    altered[-1] ^= 1
    with pytest.raises(AuthenticationError):
        frames.open_reply(keys, "a", altered, "c-1")
    with pytest.raises(AuthenticationError):  # made with another trial's keys
        frames.open_reply(TrialKeys("another secret"), "a", bytearray(sink.data), "c-1")


def test_a_frame_on_a_connection_that_did_not_offer_frames_is_not_served(runtime):  # noqa: F811
    """A connection whose signed requests never offered frames (``x-corral-pipeline: 1``)
    reads only text heads: a frame there is not a request (400/401, closed)."""
    host, port = runtime.test_address.rsplit(":", 1)
    keys = TrialKeys(SECRET)
    body = wire.encode_bytes(_call("echo", "unoffered"))
    rid = _rid()
    data, _nonce = frames.request_frame(RequestSigner(keys), "/call", rid, "", body)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(_text_request(_call("echo", 1), _rid(), offer="1"))
        reader = SocketReader(sock)
        head = reader.read_head()  # a text reply: frames were not offered
        assert head is not None and head.status == 200
        reader.read_body(head.content_length)
        sock.sendall(data + b"\r\n\r\n")
        answer = bytes(reader.pending)
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except ConnectionError:
            pass
    assert answer.startswith((b"HTTP/1.1 400", b"HTTP/1.1 401")), answer[:60]
    time.sleep(0.5)  # a request that was (wrongly) taken would be in the cache by now
    assert runtime.cache.begin(rid) is None  # never run


def test_send_small_resolves_to_the_result_the_remote_error_or_a_broken_connection(runtime):  # noqa: F811
    """The fast path ``Caller.acall`` awaits: no framed connection yet → None (use
    ``start``); then the future of the decoded result, of the engine's error, and an
    OSError when the connection breaks with the call in flight."""
    client = AsyncRPCClient(SECRET)
    address = runtime.test_address

    async def go():
        before = client.send_small(address, "/call", _call("echo", 0), _rid(), None)
        await client.request(address, "/call", _call("echo", "open"))  # its reply: text
        await client.request(address, "/call", _call("echo", "framed"))  # this one: a frame
        result = await client.send_small(address, "/call", _call("echo", [1, 2]), _rid(), None)
        failing = client.send_small(address, "/call", _call("fail", "no"), _rid(), None)
        with pytest.raises(EngineCallError, match="no"):
            await failing
        late = client.send_small(address, "/call", _call("sleep", 1.0), _rid(), None)
        client._pool(address).pipe.transport.abort()  # the connection breaks mid-call
        with pytest.raises(OSError):
            await late
        return before, result

    before, result = asyncio.run(go())
    assert before is None and result == [1, 2]
    client.close()


def test_a_frame_that_arrives_in_pieces_is_read_whole(runtime):  # noqa: F811
    """The worker may see a frame's first byte, part of its fixed fields, then the rest."""
    conn = _Conn(runtime.test_address)
    data, nonce = conn.frame(_call("echo", "pieces"))
    for piece in (data[:1], data[1:5], data[5:50], data[50:]):
        conn.sock.sendall(piece)
        time.sleep(0.05)  # each piece in its own recv on the worker
    reply = _read_reply_frame(conn.sock, conn.keys, nonce)
    assert wire.decode(reply.body) == {"ok": True, "result": "pieces"}
    conn.close()


def test_a_frame_declaring_an_oversized_head_gets_400_before_it_is_read(runtime):  # noqa: F811
    """A request frame whose head length is over ``MAX_HEAD`` is malformed: 400 and the
    connection closed at once, without the worker waiting for (or reading) that head."""
    conn = _Conn(runtime.test_address)
    fixed = frames.REQUEST + (frames.MAX_HEAD + 1).to_bytes(2, "big") + (10).to_bytes(4, "big")
    conn.sock.sendall(fixed + bytes(32))  # the head and body it declares never come
    reader = SocketReader(conn.sock)
    head = reader.read_head()
    assert head is not None and head.status == 400, head
    assert "head of 1025" in bytes(reader.read_body(head.content_length)).decode()
    assert conn.sock.recv(1) == b""  # closed
    conn.close()


def test_a_frame_heads_size_is_counted_in_bytes_not_characters():
    """A field of 500 two-byte characters fits in characters but not in bytes: the
    request must go as text, not fail in ``request_frame`` (review of issue 29)."""
    wide = "\u00e9" * 500
    assert frames.head_fits("/call", "r" * 16, "w" * 500)
    assert not frames.head_fits("/call", "r" * 16, wide)
    assert not frames.head_fits("/call", wide, None)


def test_a_request_whose_fields_overflow_a_frame_head_goes_as_text(runtime):  # noqa: F811
    """A request id too long for a frame head: the client sends it with a text head, and
    it is answered."""
    long_id = "r" * frames.MAX_HEAD
    assert not frames.head_fits("/call", long_id, None)
    client = AsyncRPCClient(SECRET)

    async def go():
        await client.request(runtime.test_address, "/call", _call("echo", 0))  # frames on
        return await client.request(
            runtime.test_address, "/call", _call("echo", "long"), request_id=long_id
        )

    assert asyncio.run(go()) == "long"
    client.close()
