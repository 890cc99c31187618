"""A minimal HTTP/1.1 layer over blocking sockets: just enough for keep-alive RPC.

Bodies have a Content-Length (no chunking). Large bodies are received straight into one
preallocated buffer and sent from the caller's buffers without joining them.
"""

from __future__ import annotations

import _socket  # socket's C module: socket.py loads enum (a worker's start)
import struct
import sys
import time

from corral.errors import ProtocolError
from corral.rpc.wire import frame_size

MAX_HEAD_BYTES = 64 * 1024
LARGE_BODY = 1 << 20
SPARE_BUFFERS = 2
REQUEST_ID_HEADER = "x-corral-request-id"
IDENTITY_HEADER = "x-corral-worker"
#: on a request: the client pipelines this connection (replies name their request ids)
PIPELINE_HEADER = "x-corral-pipeline"
FRAME_TYPE = "application/x-corral-frame"
_SMALL = 64 * 1024
REASONS = {
    200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
    409: "Conflict", 413: "Payload Too Large", 500: "Internal Server Error",
    503: "Service Unavailable",
}  # fmt: skip


class Message:
    """A parsed request (``method``/``path``) or response (``status``)."""

    __slots__ = ("start_line", "headers", "body", "method", "path", "status", "peer")

    def __init__(self, start_line: str, headers: dict[str, str], body=None) -> None:
        self.start_line = start_line
        self.headers = headers
        self.body = bytearray() if body is None else body
        self.method = ""
        self.path = ""
        self.status = 0
        #: (server side) the client's pid when it runs on this host and reads shared memory
        self.peer: int | None = None

    def __repr__(self) -> str:
        return f"Message({self.start_line!r}, {len(self.headers)} headers)"

    @property
    def content_length(self) -> int:
        raw = self.headers.get("content-length", "0")
        if not raw.isdigit():
            raise ProtocolError(f"bad Content-Length {raw!r}")
        return int(raw)

    @property
    def keep_alive(self) -> bool:
        return self.headers.get("connection", "").lower() != "close"


def parse_head(raw: bytes | bytearray) -> Message:
    """Parse a request or status line and its headers (without the blank line). A bare LF
    or CR anywhere (inside a value too) is refused: lines end with CRLF only, so no header
    value can carry another header (``shm.signed_headers`` relies on it)."""
    text = raw.decode("latin-1")
    first, *lines = text.split("\r\n")
    if text.count("\n") != len(lines) or text.count("\r") != len(lines):
        raise ProtocolError("bare LF or CR in an HTTP head: lines must end with CRLF")
    headers: dict[str, str] = {}
    for line in lines:
        name, sep, value = line.partition(":")
        if not sep:
            raise ProtocolError(f"malformed HTTP header line {line[:80]!r}")
        headers[name.strip().lower()] = value.strip()
    msg = Message(first, headers)
    parts = first.split(" ", 2)
    if len(parts) < 2:
        raise ProtocolError(f"malformed HTTP start line {first[:80]!r}")
    if parts[0].startswith("HTTP/"):
        if not parts[1].isdigit():
            raise ProtocolError(f"malformed HTTP status line {first[:80]!r}")
        msg.status = int(parts[1])
    else:
        msg.method, msg.path = parts[0], parts[1]
    return msg


def render_head(start_line: str, headers: dict[str, str], length: int) -> bytes:
    lines = [start_line, *(f"{k}: {v}" for k, v in headers.items()), f"Content-Length: {length}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class SocketReader:
    """Reads HTTP heads and exact-size bodies from a socket, keeping any surplus bytes."""

    def __init__(self, sock: _socket.socket, kernel_timeouts: bool = False):
        """``kernel_timeouts`` (the server): the socket stays in blocking mode and
        ``set_timeout`` sets the kernel's receive and send timeouts (``SO_RCVTIMEO``,
        ``SO_SNDTIMEO``) instead of Python's: Python polls before every receive and send of
        a socket with a timeout, the kernel does not, which saves two system calls (and two
        GIL hand-offs) per request. A timeout then raises TimeoutError all the same."""
        self.sock = sock
        self.pending = bytearray()
        self._spares: list = []
        self._kernel_timeouts = kernel_timeouts
        self._kernel_timeout: float | None = None  # what SO_RCVTIMEO is set to
        if kernel_timeouts:
            sock.settimeout(None)

    def read_head(
        self, idle_timeout: float | None = None, head_timeout: float | None = None
    ) -> Message | None:
        """The next message head, or None if the peer closed cleanly between messages.

        With timeouts (the server): wait at most ``idle_timeout`` for its first byte, then
        at most ``head_timeout`` for the whole head; TimeoutError beyond. Without (the
        client), the socket's own timeout applies."""
        deadline = None
        while True:
            end = self.pending.find(b"\r\n\r\n")
            if end >= 0:
                break
            if len(self.pending) > MAX_HEAD_BYTES:
                raise ProtocolError(f"HTTP head longer than {MAX_HEAD_BYTES} bytes")
            if head_timeout is not None:
                if self.pending and deadline is None:
                    deadline = time.monotonic() + head_timeout
                if deadline is None:
                    self.set_timeout(idle_timeout)
                else:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError(f"HTTP head not complete within {head_timeout}s")
                    self.set_timeout(left)
            chunk = self._recv()
            if not chunk:
                if self.pending:
                    raise ConnectionResetError("peer closed the connection mid-message")
                return None
            self.pending += chunk
        head = bytes(self.pending[:end])
        del self.pending[: end + 4]
        return parse_head(head)

    def peek(self, idle_timeout: float | None = None) -> int | None:
        """The next byte without taking it, waiting at most ``idle_timeout`` for it; None
        if the peer closed (a binary frame and an HTTP head differ in their first byte)."""
        if not self.pending:
            self.set_timeout(idle_timeout)
            chunk = self._recv()
            if not chunk:
                return None
            self.pending += chunk
        return self.pending[0]

    def _recv(self) -> bytes:
        """What the socket has (b"": the peer closed); TimeoutError at its timeout."""
        try:
            return self.sock.recv(_SMALL)
        except BlockingIOError:  # the kernel's receive timeout ran out
            raise TimeoutError("no data within the connection's timeout") from None

    def set_timeout(self, timeout: float | None) -> None:
        """The socket's timeout; unchanged values make no system call (``settimeout``
        always does one), so a steady request stream pays none."""
        if not self._kernel_timeouts:
            if self.sock.gettimeout() != timeout:
                self.sock.settimeout(timeout)
            return
        if timeout != self._kernel_timeout:
            seconds = max(timeout or 0.0, 0.0)
            whole = int(seconds)
            # 0 means "no timeout" to the kernel: a positive timeout is at least 1 us
            micro = max(int((seconds - whole) * 1e6), 1 if timeout and not whole else 0)
            value = struct.pack("@ll", whole, micro)
            self.sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_RCVTIMEO, value)
            self.sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_SNDTIMEO, value)
            self._kernel_timeout = timeout

    def read_body(self, length: int) -> bytearray | memoryview:
        """The next ``length`` bytes. Large bodies land in an uninitialised buffer that is
        reused for the next large body once nothing (no decoded array) refers to it."""
        if length <= len(self.pending):
            body = self.pending[:length]
            del self.pending[:length]
            return body
        body = self._large_buffer(length) if length >= LARGE_BODY else memoryview(bytearray(length))
        have = len(self.pending)
        body[:have] = self.pending
        self.pending = bytearray()
        view = body
        while have < length:
            try:
                n = self.sock.recv_into(view[have:], min(length - have, 1 << 24))
            except BlockingIOError:  # the kernel's receive timeout ran out
                raise TimeoutError(f"body stalled after {have} of {length} bytes") from None
            if n == 0:
                raise ConnectionResetError(
                    f"peer closed the connection after {have} of {length} body bytes"
                )
            have += n
        return body

    def _large_buffer(self, length: int) -> memoryview:
        import numpy as np

        for spare in self._spares:
            # free: referenced only by the list, the loop variable and getrefcount itself
            if length <= spare.nbytes <= 2 * length and sys.getrefcount(spare) <= 3:
                return memoryview(spare)[:length]
        fresh = np.empty(length, dtype=np.uint8)
        self._spares = [fresh, *self._spares][:SPARE_BUFFERS]
        return memoryview(fresh)


def send_message(
    sock: _socket.socket, start_line: str, headers: dict[str, str], parts: list
) -> None:
    """Send a head and body parts; small messages go out in one syscall."""
    length = frame_size(parts)
    data = render_head(start_line, headers, length)
    if length <= _SMALL:
        if len(parts) == 1 and type(parts[0]) is bytes:
            sock.sendall(data + parts[0])
        else:
            sock.sendall(
                b"".join([data, *(bytes(p) if type(p) is memoryview else p for p in parts)])
            )
        return
    sock.sendall(data)
    for part in parts:
        sock.sendall(part)


def tune_socket(sock: _socket.socket) -> None:
    sock.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
