"""A pipelined connection for the asyncio client: many small calls in flight at once.

The async client sends small ``/call`` requests to a worker over one such connection
without waiting for earlier replies (each request carries ``x-corral-pipeline``). Requests
made in the same event-loop turn leave in one ``send``; the worker answers each as soon as
it is ready, naming its request id, and one ``recv`` brings back as many replies as have
arrived. Each reply head is checked (signature bound to its own request's nonce, size
limit) before its body is taken, exactly as on a one-at-a-time connection. A reply whose
body came in a shared-memory segment, or was large, is acknowledged with an ``ACK``/``NAK``
line naming its request id: that is the worker's proof of delivery (on a one-at-a-time
connection the next request is the proof; here it proves nothing).

Small requests and replies may also travel as binary frames (``rpc.frames``): the client
offers them on its text requests, the worker answers small replies as frames, and once a
verified frame has come back (``framed``) the client sends its small requests as frames
too. Text heads and frames mix freely on one connection: each starts with its own byte.
"""

from __future__ import annotations

import asyncio
from typing import Any

from corral.errors import ProtocolError
from corral.rpc import frames
from corral.rpc.http import MAX_HEAD_BYTES, REQUEST_ID_HEADER, Message, parse_head

#: the header every request on a pipelined connection carries; its value offers frames
PIPELINE_LINE = f"x-corral-pipeline: {frames.OFFER}\r\n"
#: the same without the offer: text heads only (``AsyncRPCClient(frames=False)``)
TEXT_PIPELINE_LINE = "x-corral-pipeline: 1\r\n"


def ack(method: bytes, request_id: str) -> bytes:
    """``ACK`` (the reply to ``request_id`` was read whole) or ``NAK`` (its segment could
    not be mapped: the worker takes it back) on a pipelined connection."""
    return b"%s /shm HTTP/1.1\r\n%s: %s\r\nContent-Length: 0\r\n\r\n" % (
        method,
        REQUEST_ID_HEADER.encode(),
        request_id.encode("latin-1"),
    )


class Pipe(asyncio.Protocol):
    """One connection, many requests in flight, replies matched by request id.

    ``check(msg, nonce)`` is called with each reply head and its request's nonce before
    the body is read; it returns the body digest, or raises to refuse the reply (the
    connection is then closed and every other call on it fails with ConnectionError, to
    be retried). ``check_body(digest, body)`` raises if the body is not the one signed.
    ``check_frame(frame, nonce, start)`` is ``rpc.frames.check_reply`` for this
    connection's keys.
    ``finish(pipe, request_id, msg)`` turns the reply of a call expected with ``finish=True``
    into its result (its future gets that result, or what it raised); ``finish_frame(status,
    content_type, body)`` does the same for a reply that came as a frame (no shared
    memory, no ACK)."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, check, check_body, max_reply: int, check_frame,
        finish=None, finish_frame=None,
    ):  # fmt: skip
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.pending: dict[str, tuple[asyncio.Future, str, bool]] = {}
        self.offered = False  # has the shared-memory offer gone out on this connection?
        self.closed: BaseException | None = None
        self.framed = False  # a verified reply frame came: the worker reads frames too
        self._check_frame, self._finish, self._finish_frame = check_frame, finish, finish_frame
        self._check, self._check_body, self._max_reply = check, check_body, max_reply
        self._buf = bytearray()
        self._out: list[bytes] = []
        self._head: tuple[Message, int, Any, str, bool] | None = None  # reply whose body is due

    # ------------------------------------------------------------------ sending
    def send(self, data: bytes) -> None:
        """Queue ``data``; everything queued in this event-loop turn leaves in one write."""
        if not self._out:
            self.loop.call_soon(self._flush)
        self._out.append(data)

    def _flush(self) -> None:
        out, self._out = self._out, []
        if self.closed is None and self.transport is not None:
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))

    def expect(
        self, request_id: str, nonce: str, finish: bool = False,
        future: asyncio.Future | None = None,
    ) -> asyncio.Future:  # fmt: skip
        """A future for the reply to ``request_id`` (``future``, or a new one): set to the
        reply Message, or with ``finish`` to the call's result (``finish`` of the
        constructor)."""
        if future is None:
            future = self.loop.create_future()
        self.pending[request_id] = (future, nonce, finish)
        return future

    def forget(self, request_id: str) -> None:
        """A call given up (cancelled, timed out): its reply is dropped when it comes."""
        self.pending.pop(request_id, None)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    # ------------------------------------------------------------------ receiving
    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        try:
            while True:
                if self._head is None and buf and buf[0] == frames.FRAME_BYTE:
                    if len(buf) < frames.HEAD_START:
                        return
                    size = frames.reply_size(buf)
                    if len(buf) < size:
                        return
                    frame = buf[:size]
                    del buf[:size]
                    if not self._framed_reply(frame):
                        return
                    continue
                if self._head is None:
                    end = buf.find(b"\r\n\r\n")
                    if end < 0:
                        if len(buf) > MAX_HEAD_BYTES:
                            raise ProtocolError(f"reply head longer than {MAX_HEAD_BYTES} bytes")
                        return
                    msg = parse_head(buf[:end])
                    del buf[: end + 4]
                    rid = msg.headers.get(REQUEST_ID_HEADER)
                    if rid is None and self.pending:  # a peer that does not pipeline: in order
                        rid = next(iter(self.pending))
                    entry = self.pending.pop(rid, None)
                    if entry is None:  # a reply to a call given up: drop it
                        if msg.content_length > self._max_reply:
                            raise ProtocolError("an unclaimed reply is over the size limit")
                        self._head = (msg, msg.content_length, None, "", False)
                    else:
                        future, nonce, finish = entry
                        try:
                            digest = self._check(msg, nonce)
                        except BaseException as exc:  # refused before its body is read
                            if not future.done():
                                future.set_exception(exc)
                            self._fail(ConnectionResetError(f"{exc.__class__.__name__}: {exc}"))
                            return
                        self._head = (msg, msg.content_length, future, digest, finish)
                msg, length, future, digest, finish = self._head
                if len(buf) < length:
                    return
                self._head = None
                body = buf[:length]
                del buf[:length]
                if future is None:
                    if "x-corral-shm" in msg.headers:  # its segment goes back to the worker
                        self.send(ack(b"NAK", msg.headers.get(REQUEST_ID_HEADER, "")))
                    continue
                if future.done():
                    continue
                try:
                    self._check_body(digest, body)
                except BaseException as exc:
                    future.set_exception(exc)
                    self._fail(ConnectionResetError(f"{exc.__class__.__name__}: {exc}"))
                    return
                msg.body = body
                self._resolve(future, msg, finish)
        except ProtocolError as exc:
            self._fail(exc)

    def _framed_reply(self, frame: bytearray) -> bool:
        """A whole reply frame: to its call once verified (False: the connection failed)."""
        # checked below, before anything of it but the request id is used
        status, request_id, content_type, start = frames.reply_head(frame)
        entry = self.pending.pop(request_id, None)
        if entry is None:  # a reply to a call given up: drop it
            return True
        future, nonce, finish = entry
        try:
            self._check_frame(frame, nonce, start)
        except BaseException as exc:  # not made by the worker for this request
            if not future.done():
                future.set_exception(exc)
            self._fail(ConnectionResetError(f"{exc.__class__.__name__}: {exc}"))
            return False
        self.framed = True
        if future.done():
            return True
        if not finish:
            future.set_result(frames.reply_message(frame))
            return True
        try:
            result = self._finish_frame(status, content_type, frame[start:])
        except BaseException as exc:  # the remote error
            future.set_exception(exc)
        else:
            future.set_result(result)
        return True

    def _resolve(self, future: asyncio.Future, msg: Message, finish: bool) -> None:
        if not finish:
            future.set_result(msg)
            return
        try:
            result = self._finish(self, msg.headers.get(REQUEST_ID_HEADER, ""), msg)
        except BaseException as exc:  # the remote error, or a reply refused
            future.set_exception(exc)
        else:
            future.set_result(result)

    def _fail(self, exc: BaseException) -> None:
        """The connection is unusable: every call still waiting on it fails with ``exc``."""
        if self.closed is None:
            self.closed = exc
        pending, self.pending = self.pending, {}
        for future, _nonce, _finish in pending.values():
            if not future.done():
                future.set_exception(
                    exc if isinstance(exc, OSError) else ConnectionResetError(str(exc))
                )
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._fail(exc or ConnectionResetError("the worker closed the connection"))
