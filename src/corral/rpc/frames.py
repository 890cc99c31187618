"""The binary frame of a pipelined connection: a small request or reply in one MAC.

On a pipelined connection (``rpc.pipeline``) whose client offered it (``x-corral-pipeline:
b1`` on its signed text requests), small requests and replies may travel as binary
frames instead of HTTP heads with a body digest. A frame is::

    kind      2 bytes   b"\\xc7\\x01" request, b"\\xc7\\x02" reply (0xC7 starts no HTTP line)
    head_len  2 bytes   unsigned, big-endian
    body_len  4 bytes   unsigned, big-endian, below SMALL_BODY
    mac      32 bytes   HMAC-SHA256, see below
    head     head_len bytes of UTF-8, fields separated by LF
    body     body_len bytes (the wire frame of the payload or the reply envelope)

A request's head is ``path, request id, target identity, nonce, timestamp``; its MAC, under
the ``frame-request`` key, covers the first 8 bytes, the head and the body. A reply's head is
``status, request id, content type``; its MAC, under the ``frame-reply`` key, covers the
first 8 bytes, the head, the request's nonce (one length byte, then the nonce: it is not
sent, the client knows it) and the body. So one MAC covers what the text head's signature
and body digest covered together, and a reply is bound to its request.

The server takes frames only on a connection that has carried a signed text request
offering them, and checks the nonce and timestamp with the same replay guard as text
heads. The frame's body is read before its MAC is checked: it is at most ``SMALL_BODY``
bytes, on a connection that already proved the secret. Anything a frame cannot carry (a
shared-memory header, a large body, a refusal) goes as a text head on the same connection.

A one-request-at-a-time connection (the blocking client, ``rpc.client``) offers frames with
``x-corral-frames: b1`` (``OFFER_HEADER``) instead: it stays one request at a time (the next
request still proves the last reply's delivery, and the worker may lend it to its engine
thread), but its small requests and replies go as the same frames, with the same keys,
MAC, replay guard and fallbacks. The client sends frames only once a verified reply frame
has come back on that connection.
"""

from __future__ import annotations

import struct
import time

from corral.auth import RequestSigner, RequestVerifier, TrialKeys, compare_digest
from corral.errors import AuthenticationError, ProtocolError
from corral.rpc import shm
from corral.rpc.http import IDENTITY_HEADER, PIPELINE_HEADER, REQUEST_ID_HEADER, Message

#: the first byte of every frame (no HTTP method or status line starts with it)
FRAME_BYTE = 0xC7
REQUEST = b"\xc7\x01"
REPLY = b"\xc7\x02"
#: the ``x-corral-pipeline`` value of a client that sends and reads frames
OFFER = "b1"
#: on a one-request-at-a-time connection's text requests: the client reads reply frames
#: (value ``OFFER``), and sends frames once one came back
OFFER_HEADER = "x-corral-frames"
#: a frame's body is below this (larger ones go with a text head)
MAX_BODY = 64 * 1024
#: a frame's head is at most this (its fields are short)
MAX_HEAD = 1024
_FIXED = struct.Struct("!2sHI")
#: bytes before the head: kind, lengths, MAC
HEAD_START = _FIXED.size + 32


def head_fits(path: str, request_id: str, identity: str | None) -> bool:
    """Can a request frame carry these fields (with a nonce and a timestamp) within
    ``MAX_HEAD``? Else the request goes with a text head. (Counted in UTF-8 bytes, as
    the head is sent.)"""
    identity = identity or ""
    size = len(path) + len(request_id) + len(identity)
    if not (path.isascii() and request_id.isascii() and identity.isascii()):
        size = len(path.encode()) + len(request_id.encode()) + len(identity.encode())
    return size < MAX_HEAD - 128


def request_frame(
    signer: RequestSigner, path: str, request_id: str, identity: str, body: bytes
) -> tuple[bytes, str]:
    """A signed request frame for ``body`` (below ``MAX_BODY``), and its nonce."""
    keys = signer.keys
    nonce = signer.next_nonce()
    head = f"{path}\n{request_id}\n{identity}\n{nonce}\n{time.time():.3f}".encode()
    if len(head) > MAX_HEAD:  # callers ask ``head_fits`` first
        raise ProtocolError(f"a request frame's head of {len(head)} bytes (limit {MAX_HEAD})")
    fixed = _FIXED.pack(REQUEST, len(head), len(body))
    mac = keys.mac(keys.frame_request, fixed, head, body)
    return b"".join((fixed, mac, head, body)), nonce


def read_request(
    reader, verifier: RequestVerifier, timeout: float
) -> tuple[Message | None, str | None, str]:
    """The next request frame from a ``SocketReader`` (its first byte is ``FRAME_BYTE``):
    ``take_request`` once it is all here. Waits at most ``timeout`` for each part that is
    not here yet; ProtocolError for a malformed frame."""
    if len(reader.pending) < _FIXED.size:
        reader.set_timeout(timeout)
        fixed = bytes(reader.read_body(_FIXED.size))
        reader.pending[:0] = fixed  # put back: the frame is taken whole below
    head_len, body_len = _lengths(reader.pending, REQUEST, "request")
    size = HEAD_START + head_len + body_len
    if len(reader.pending) < size:
        reader.set_timeout(timeout)
        whole = reader.read_body(size)
        reader.pending[:0] = whole  # put back whole
    return take_request(reader.pending, verifier)


def request_size(buf: bytearray) -> int:
    """Bytes of the request frame at the start of ``buf`` (``HEAD_START`` of them at least
    are there); ProtocolError if it is not one."""
    head_len, body_len = _lengths(buf, REQUEST, "request")
    return HEAD_START + head_len + body_len


def request_path(frame: bytearray) -> str:
    """The path a whole request frame names, NOT verified: only to choose which thread
    serves it (``open_request`` then checks it)."""
    start = HEAD_START + _FIXED.unpack_from(frame)[1]
    return frame[HEAD_START:start].decode("utf-8", "replace").partition("\n")[0]


def open_request(
    frame: bytearray | memoryview, verifier: RequestVerifier
) -> tuple[Message | None, str | None, str]:
    """A whole request frame on its own (a lent connection's), checked as ``take_request``
    checks one."""
    return take_request(frame if type(frame) is bytearray else bytearray(frame), verifier)


def take_request(
    buf: bytearray, verifier: RequestVerifier
) -> tuple[Message | None, str | None, str]:
    """The request frame at the start of ``buf``, all of it there (``request_ready``),
    taken from ``buf`` and checked: ``(message, None, nonce)``, or ``(None, why refused,
    "")`` for a wrong MAC, a malformed head, a stale timestamp or a nonce seen before.
    ProtocolError for a frame over the limits."""
    head_len, body_len = _lengths(buf, REQUEST, "request")
    return _take(buf, verifier, head_len, body_len)


def take_ready(
    buf: bytearray, verifier: RequestVerifier
) -> tuple[Message | None, str | None, str] | None:
    """``take_request`` if a whole request frame is at the start of ``buf``, else None
    (``request_ready`` and ``take_request`` in one, its lengths read once: a batch's
    loop, ``rpc.server``)."""
    if len(buf) < HEAD_START or buf[0] != FRAME_BYTE:
        return None
    head_len, body_len = _lengths(buf, REQUEST, "request")
    if len(buf) < HEAD_START + head_len + body_len:
        return None
    return _take(buf, verifier, head_len, body_len)


def _take(
    buf: bytearray, verifier: RequestVerifier, head_len: int, body_len: int
) -> tuple[Message | None, str | None, str]:
    """``take_request`` of a frame whose lengths were read and are within the limits."""
    start = HEAD_START + head_len
    end = start + body_len
    keys = verifier.keys
    # the MAC covers the fixed bytes, then head and body (which follow each other)
    mac = keys.mac(keys.frame_request, buf[: _FIXED.size], buf[HEAD_START:end])
    valid = compare_digest(mac, buf[_FIXED.size : HEAD_START])
    head, body = buf[HEAD_START:start], buf[start:end]
    del buf[:end]
    if not valid:
        return None, "wrong frame MAC (another trial's secret, or an altered frame)", ""
    fields = head.decode("utf-8", "replace").split("\n")
    if len(fields) != 5:
        return None, "malformed frame head", ""
    path, request_id, identity, nonce, ts = fields
    why = verifier.guard.check(nonce, ts)
    if why is not None:
        return None, why, ""
    headers = {REQUEST_ID_HEADER: request_id, IDENTITY_HEADER: identity, PIPELINE_HEADER: OFFER}
    msg = Message("FRAME", headers, body)
    msg.method, msg.path = "POST", path
    return msg, None, nonce


def send_reply(
    conn, keys: TrialKeys, reply, nonce: str, request_id: str, local: int | None
) -> bool:
    """Send ``reply`` (an ``rpc.server.Reply``) as a frame if one can carry it: no
    segment, a body below ``MAX_BODY``, no released segments to tell a local peer about.
    False: nothing was sent, the caller sends a text head."""
    out: list = []
    if not reply_frame(out, keys, reply, nonce, request_id, local):
        return False
    conn.sendall(out[0])
    return True


def reply_frame(
    out: list, keys: TrialKeys, reply, nonce: str, request_id: str, local: int | None
) -> bool:
    """``send_reply``, appending the frame to ``out`` instead of sending it."""
    if reply.segment is not None or (local is not None and shm.has_released(local)):
        return False
    parts = reply.parts
    body = parts[0] if len(parts) == 1 and type(parts[0]) is bytes else b"".join(parts)
    if len(body) >= MAX_BODY:
        return False
    head = f"{reply.status}\n{request_id}\n{reply.content_type}".encode()
    if len(head) > MAX_HEAD:
        return False
    fixed = _FIXED.pack(REPLY, len(head), len(body))
    bound = nonce.encode()
    mac = keys.mac(keys.frame_reply, fixed, head, bytes((len(bound),)), bound, body)
    out.append(b"".join((fixed, mac, head, body)))
    return True


def _lengths(buf: bytearray, kind: bytes, what: str) -> tuple[int, int]:
    """The head and body lengths of the frame at the start of ``buf``, which must be of
    ``kind`` and within the limits; ProtocolError otherwise."""
    found, head_len, body_len = _FIXED.unpack_from(buf)
    if found != kind:
        raise ProtocolError(f"a frame of kind {bytes(found)!r} where a {what} was due")
    if body_len >= MAX_BODY or head_len > MAX_HEAD:
        raise ProtocolError(
            f"a {what} frame's head of {head_len} and body of {body_len} bytes (limits "
            f"{MAX_HEAD}, below {MAX_BODY})"
        )
    return head_len, body_len


def request_ready(buf: bytearray) -> bool:
    """Is a whole request frame at the start of ``buf``? ProtocolError if something there
    claims to be a frame and is not a request within the limits."""
    if len(buf) < HEAD_START or buf[0] != FRAME_BYTE:
        return False
    head_len, body_len = _lengths(buf, REQUEST, "request")
    return len(buf) >= HEAD_START + head_len + body_len


def reply_size(buf: bytearray) -> int:
    """Bytes of the reply frame at the start of ``buf`` (``HEAD_START`` of them at least
    are there); ProtocolError if it is not one."""
    head_len, body_len = _lengths(buf, REPLY, "reply")
    return HEAD_START + head_len + body_len


def reply_head(frame: bytearray) -> tuple[int, str, str, int]:
    """``(status, request id, content type, where the body starts)`` of a whole reply
    frame, NOT yet verified (``check_reply`` does): its request id says which request's
    nonce to check it with."""
    start = HEAD_START + _FIXED.unpack_from(frame)[1]
    fields = frame[HEAD_START:start].decode("utf-8", "replace").split("\n")
    if len(fields) != 3:
        raise ProtocolError("malformed reply frame head")
    status, request_id, content_type = fields
    return (int(status) if status.isdigit() else 0), request_id, content_type, start


def reply_message(frame: bytearray) -> Message:
    """A whole reply frame as a Message, NOT yet verified (``check_reply`` does)."""
    status, request_id, content_type, start = reply_head(frame)
    msg = Message("FRAME", {"content-type": content_type, REQUEST_ID_HEADER: request_id})
    msg.status = status
    msg.body = frame[start:]
    return msg


def check_reply(
    keys: TrialKeys, address: str, frame: bytearray, nonce: str, start: int | None = None
) -> None:
    """Raise AuthenticationError unless the reply frame's MAC proves it was made by the
    trial's worker for the request that carried ``nonce``. ``start``: where its body
    starts, if known (``reply_head``)."""
    if start is None:
        start = HEAD_START + _FIXED.unpack_from(frame)[1]
    bound = nonce.encode()
    want = keys.mac(
        keys.frame_reply, frame[: _FIXED.size], frame[HEAD_START:start], bytes((len(bound),)),
        bound, frame[start:],
    )  # fmt: skip
    if not compare_digest(want, frame[_FIXED.size : HEAD_START]):
        raise _wrong_mac(address)


def _wrong_mac(address: str) -> AuthenticationError:
    return AuthenticationError(
        f"the peer at {address} sent a reply frame whose MAC is wrong: it is not this "
        "trial's worker, the frame was altered on the way, or it answers another request"
    )


def open_reply(keys: TrialKeys, address: str, frame: bytearray, nonce: str) -> Message:
    """``check_reply``, then ``reply_message``."""
    check_reply(keys, address, frame, nonce)
    return reply_message(frame)


def reply_fields(
    keys: TrialKeys, address: str, frame: bytearray, nonce: str
) -> tuple[int, str, bytearray]:
    """``open_reply`` in one pass, without a Message (the blocking client's every small
    call): ``(status, content type, body)`` of a whole reply frame once ``check_reply``
    would pass; AuthenticationError or ProtocolError as there."""
    start = HEAD_START + _FIXED.unpack_from(frame)[1]
    check_reply(keys, address, frame, nonce, start)
    fields = frame[HEAD_START:start].decode("utf-8", "replace").split("\n")
    if len(fields) != 3:
        raise ProtocolError("malformed reply frame head")
    status, _, content_type = fields
    return (int(status) if status.isdigit() else 0), content_type, frame[start:]


def read_reply(reader) -> bytearray:
    """The next reply frame, whole, from a blocking ``SocketReader`` whose next byte is
    ``FRAME_BYTE`` (the socket's own timeout applies); NOT yet verified."""
    if len(reader.pending) < HEAD_START:
        reader.pending[:0] = bytes(reader.read_body(HEAD_START))  # put back: taken whole below
    frame = reader.read_body(reply_size(reader.pending))
    return frame if type(frame) is bytearray else bytearray(frame)
