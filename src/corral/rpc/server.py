"""The worker's RPC server: one thread per keep-alive connection, authenticated first."""

from __future__ import annotations

import hmac
import logging
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from corral.errors import ProtocolError
from corral.rpc import shm
from corral.rpc.http import (
    IDENTITY_HEADER,
    REASONS,
    REQUEST_ID_HEADER,
    SECRET_HEADER,
    Message,
    SocketReader,
    send_message,
    tune_socket,
)

log = logging.getLogger(__name__)
DEFAULT_MAX_BODY = 8 * 1024**3


@dataclass
class Reply:
    status: int = 200
    parts: list = field(default_factory=list)
    content_type: str = "application/x-corral-frame"
    #: a prebuilt shared-memory copy of ``parts`` (sent instead when the peer is local)
    segment: Any = None


class Deferred:
    """A reply made on another thread: the handler returns it, the server calls
    ``start(send)`` and goes on reading the connection; ``send(reply)`` is then called
    exactly once, on that other thread, and writes the reply. Only for keep-alive
    requests: the client sends its next request after it has read this reply."""

    __slots__ = ("start",)

    def __init__(self, start: Callable[[Callable[[Reply], None]], None]):
        self.start = start


Handler = Callable[[Message], "Reply | Deferred"]


class RPCServer:
    """Serves ``handler`` on a port the kernel picks. Requests without the trial secret
    get 401 before their body is read, and the connection is closed."""

    def __init__(
        self,
        secret: str,
        handler: Handler,
        host: str = "0.0.0.0",
        port: int = 0,
        max_body: int = DEFAULT_MAX_BODY,
        identity: str = "",
        delivered: Callable[[str], None] | None = None,
    ):
        """``delivered(request_id)`` is called when the client sends its next request on
        the same connection: proof that it read the whole reply to that one."""
        self._secret = secret.encode()
        self.identity = identity
        self._delivered = delivered
        self._handler = handler
        self._max_body = max_body
        self._sock = socket.create_server((host, port), backlog=512, reuse_port=False)
        self.port: int = self._sock.getsockname()[1]
        self._closed = threading.Event()
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept_loop, name="rpc-accept", daemon=True)

    def start(self) -> RPCServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._closed.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        with self._lock:
            for conn in list(self._conns):
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            tune_socket(conn)
            with self._lock:
                self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn,), name="rpc-conn", daemon=True).start()

    def _authorized(self, msg: Message) -> bool:
        given = msg.headers.get(SECRET_HEADER, "").encode("latin-1", "replace")
        return hmac.compare_digest(given, self._secret)

    def _serve(self, conn: socket.socket) -> None:
        reader = SocketReader(conn)
        answered: str | None = None
        held: list = []  # a reply's segment, kept until the client has mapped it
        peer: int | None = None  # the client's pid once it offered shared memory
        try:
            while not self._closed.is_set():
                msg = reader.read_head()
                if msg is None or not msg.method:
                    return
                if msg.method in ("ACK", "NAK"):  # the client mapped (or failed to map) it
                    if msg.method == "ACK" and answered and self._delivered is not None:
                        self._delivered(answered)  # proof it has the whole reply
                    if msg.method == "NAK":  # it will ask again with the same id
                        for seg, peer in held:
                            shm.POOL.returned([seg.name], peer)
                    answered = None
                    held.clear()
                    continue
                if answered and self._delivered is not None:
                    self._delivered(answered)
                    answered = None
                if not self._authorized(msg):
                    self._reply(
                        conn, Reply(401, [b"missing or wrong trial secret"], "text/plain"), False
                    )
                    return
                wanted = msg.headers.get(IDENTITY_HEADER)
                if wanted and self.identity and wanted != self.identity:
                    text = f"this is {self.identity}, not {wanted}: the address is stale"
                    self._reply(conn, Reply(409, [text.encode()], "text/plain"), False)
                    return
                length = msg.content_length
                if length > self._max_body:
                    self._reply(
                        conn,
                        Reply(413, [f"body over {self._max_body} bytes".encode()], "text/plain"),
                        False,
                    )
                    return
                offered = shm.OFFER_HEADER in msg.headers
                if offered:
                    peer = local_peer(msg)
                if peer is not None and shm.RELEASED_HEADER in msg.headers:
                    shm.take_released(msg.headers[shm.RELEASED_HEADER], peer)
                descriptor = msg.headers.get(shm.SEGMENT_HEADER)
                if descriptor is not None:
                    try:
                        msg.body = shm.open_segment(descriptor, self._max_body)
                    except ProtocolError as exc:
                        refused = Reply(400, [str(exc).encode()], "text/plain")
                        self._reply(conn, refused, msg.keep_alive, refused=True)
                        continue
                else:
                    msg.body = reader.read_body(length)
                msg.peer = peer
                reply = self._handler(msg)
                msg.body = bytearray()
                if isinstance(reply, Deferred):
                    # held before it is sent: the client's ACK may come at once
                    hold = lambda seg, p=peer: held.append((seg, p))  # noqa: E731
                    reply.start(
                        lambda r, c=conn, p=peer, o=offered, h=hold: self._send_later(c, r, p, o, h)
                    )
                else:
                    segment = self._reply(conn, reply, msg.keep_alive, peer, announce=offered)
                    if segment is not None:
                        held.append((segment, peer))
                answered = msg.headers.get(REQUEST_ID_HEADER)
                if not msg.keep_alive:
                    return
        except ProtocolError as exc:
            try:
                self._reply(conn, Reply(400, [str(exc).encode()], "text/plain"), False)
            except OSError:
                pass
        except OSError:
            pass
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    @staticmethod
    def _send_later(
        conn: socket.socket, reply: Reply, peer: int | None, offered: bool, hold
    ) -> None:
        """Write a deferred reply (on the engine thread); if that fails, end the connection
        (its own thread then sees it)."""
        try:
            RPCServer._reply(conn, reply, True, peer, announce=offered, hold=hold)
        except OSError:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    @staticmethod
    def _reply(
        conn: socket.socket,
        reply: Reply,
        keep_alive: bool,
        local: int | None = None,
        refused: bool = False,
        announce: bool = False,
        hold=None,
    ) -> shm.Segment | None:
        """Send ``reply``; a large one to a local peer goes in a segment, which is returned
        so that the caller holds it until the client acknowledges it (``hold(segment)``, if
        given, is called with it before anything is sent)."""
        headers = {"Content-Type": reply.content_type}
        if not keep_alive:
            headers["Connection"] = "close"
        if refused:
            headers[shm.REFUSED_HEADER] = "1"
        status_line = f"HTTP/1.1 {reply.status} {REASONS.get(reply.status, 'Status')}"
        parts, segment = reply.parts, None
        if local is not None:
            if announce:  # answers the offer: the client now knows we share a host
                headers[shm.LOCAL_HEADER] = str(os.getpid())
            released = shm.released_for(local)
            if released:
                headers[shm.RELEASED_HEADER] = released
            if reply.segment is not None:
                segment = reply.segment
                shm.POOL.lend(segment, local)
            elif shm.wants_segment(parts, True):
                segment = shm.Segment.from_parts(parts, local)
            if segment is not None:
                headers[shm.SEGMENT_HEADER] = segment.descriptor()
                parts = []
                if hold is not None:
                    hold(segment)
        send_message(conn, status_line, headers, parts)
        return segment


def local_peer(msg: Message) -> int | None:
    """The client's pid if it offered shared memory and runs on this host, else None."""
    offer = msg.headers.get(shm.OFFER_HEADER)
    if not offer:
        return None
    token, _, pid = offer.partition(" ")
    if token != shm.host_token() or not token or not pid.isdigit():
        return None
    return int(pid)
