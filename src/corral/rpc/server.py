"""The worker's RPC server: one thread per authenticated keep-alive connection.

A connection is either one request at a time (the client sends its next request after it
has read the last reply: that next request proves delivery) or *pipelined* (requests carry
``x-corral-pipeline``): the client sends requests without waiting, replies go out as they
are ready, each naming its request id, and the client proves delivery of a large reply or a
segment with an ``ACK``/``NAK`` line naming the request id (``rpc.pipeline.ack``).

Every request head must carry a valid signature made with the trial secret (see
``corral.auth``); one without gets 401 before its body is read, and the connection is
closed. The server bounds what an unauthenticated peer can hold: until it has sent a whole
first head a connection waits in the gate (``corral.rpc.gate``: no thread, a whole-head
deadline of ``head_timeout``, at most ``max_unauthenticated`` waiting, half of them per
peer address, the oldest dropped for a new one); an ``ACK``/``NAK`` line before the first
signed request closes the connection; at most ``max_connections`` are served in all (an
authenticated connection may idle ``idle_timeout`` between requests), and when the process
runs out of file descriptors the gate backs off and keeps accepting.
"""

from __future__ import annotations

import os
import socket
import threading
from collections import OrderedDict
from collections.abc import Callable

from corral.auth import AUTH_HEADER, RequestVerifier, TrialKeys
from corral.errors import ProtocolError
from corral.rpc import frames, shm
from corral.rpc.gate import HeadGate, warn
from corral.rpc.http import (
    IDENTITY_HEADER,
    PIPELINE_HEADER,
    REASONS,
    REQUEST_ID_HEADER,
    Message,
    SocketReader,
    send_message,
    tune_socket,
)

TYPE_CHECKING = False  # typing's, without importing typing (a worker's start)
if TYPE_CHECKING:
    from typing import Any

DEFAULT_MAX_BODY = 8 * 1024**3
HEAD_TIMEOUT = 10.0
IDLE_TIMEOUT = 300.0
BODY_IDLE_TIMEOUT = 60.0
MAX_CONNECTIONS = 512
MAX_UNAUTHENTICATED = 64
_ACKS = ("ACK", "NAK")
_STATUS_LINES = {code: f"HTTP/1.1 {code} {reason}" for code, reason in REASONS.items()}
#: request ids a pipelined connection remembers for their ACK (the client ACKs at once)
ACKABLE = 4096


class Reply:
    """A reply's status, body parts and content type. ``segment``: a prebuilt
    shared-memory copy of ``parts`` (sent instead when the peer is local). A plain class,
    not a dataclass: a worker's start does not import ``dataclasses`` (and ``inspect``)."""

    __slots__ = ("status", "parts", "content_type", "segment")

    def __init__(
        self,
        status: int = 200,
        parts: list | None = None,
        content_type: str = "application/x-corral-frame",
        segment: Any = None,
    ):
        self.status = status
        self.parts = [] if parts is None else parts
        self.content_type = content_type
        self.segment = segment

    def __repr__(self) -> str:
        return f"Reply({self.status}, {len(self.parts)} part(s), {self.content_type!r})"


class Deferred:
    """A reply made on another thread: the handler returns it, the server calls
    ``start(send)`` and goes on reading the connection; ``send(reply)`` is then called
    exactly once, on that other thread, and writes the reply (under the connection's write
    lock). Only for keep-alive requests."""

    __slots__ = ("start",)

    def __init__(self, start: Callable[[Callable[[Reply], None]], None]):
        self.start = start


Handler = Callable[[Message], "Reply | Deferred"]


class RPCServer:
    """Serves ``handler`` on ``host`` (the advertised address) and a port the kernel picks."""

    def __init__(
        self,
        secret: str,
        handler: Handler,
        host: str = "127.0.0.1",
        port: int = 0,
        max_body: int = DEFAULT_MAX_BODY,
        identity: str = "",
        delivered: Callable[[str], None] | None = None,
        *,
        head_timeout: float = HEAD_TIMEOUT,
        idle_timeout: float = IDLE_TIMEOUT,
        max_connections: int = MAX_CONNECTIONS,
        max_unauthenticated: int = MAX_UNAUTHENTICATED,
    ):
        """``delivered(request_id)`` is called when the client sends its next request on
        the same connection: proof that it read the whole reply to that one."""
        self._verifier = RequestVerifier(TrialKeys(secret))
        self.identity = identity
        self._delivered = delivered
        self._handler = handler
        self._max_body = max_body
        self.head_timeout = head_timeout
        self.idle_timeout = idle_timeout
        self.max_connections = max_connections
        self.max_unauthenticated = max_unauthenticated
        self._sock = socket.create_server((host, port), backlog=512, reuse_port=False)
        self.port: int = self._sock.getsockname()[1]
        self.stopping = False
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        # connections wait in the gate (no thread) until they have sent a whole head
        self.gate = HeadGate(
            self._sock, self._admit, name="rpc-accept", head_timeout=head_timeout,
            max_waiting=max_unauthenticated,
            max_waiting_per_peer=max(1, max_unauthenticated // 2),
        )  # fmt: skip

    @property
    def fd_exhausted(self) -> int:
        """Times accept() ran out of descriptors (for tests and logs)."""
        return self.gate.fd_exhausted

    def start(self) -> RPCServer:
        self.gate.start()
        return self

    def stop(self) -> None:
        self.stopping = True
        self.gate.close()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        with self._lock:
            for conn in list(self._conns):
                _shutdown(conn)

    # -------------------------------------------------------------- accepting
    def _admit(self, conn: socket.socket, head: bytes, _peer: str) -> None:
        """Called by the gate with a connection that has sent a whole first head."""
        with self._lock:
            over = len(self._conns) >= self.max_connections
            if not over:
                self._conns.add(conn)
        if over:
            conn.close()
            return
        try:
            tune_socket(conn)
            threading.Thread(
                target=self._serve, args=(conn, head), name="rpc-conn", daemon=True
            ).start()
        except (RuntimeError, OSError) as exc:  # no thread left: refuse this one
            warn("cannot serve a new connection: %s", exc)
            self._forget(conn)
            conn.close()

    def _forget(self, conn: socket.socket) -> None:
        with self._lock:
            self._conns.discard(conn)

    def _serve(self, conn: socket.socket, head: bytes = b"") -> None:
        reader = SocketReader(conn, kernel_timeouts=True)
        reader.pending += head  # the first head, read by the gate
        answered: str | None = None
        held: list = []  # a reply's segment, kept until the client has mapped it
        held_by_id: dict[str, tuple] = {}  # the same on a pipelined connection
        carried: OrderedDict[str, None] = OrderedDict()  # signed requests an ACK may name
        pipelined = False
        framed = False  # the client offered binary frames (``rpc.frames``)
        wlock = threading.Lock()  # one reply at a time on the socket
        peer: int | None = None  # the client's pid once it offered shared memory
        idle = self.head_timeout  # a new connection must send its first head promptly
        first = True
        try:
            while not self.stopping:
                frame = framed and reader.peek(idle) == frames.FRAME_BYTE
                if frame:  # verified whole (one MAC over head and body) and replay-checked
                    msg, why, nonce = frames.read_request(reader, self._verifier, self.head_timeout)
                    if why is not None:
                        self._refuse(conn, why, wlock)
                        return
                else:
                    msg = reader.read_head(idle, self.head_timeout)
                if msg is None or not msg.method:
                    return
                if first and msg.method in _ACKS:  # nothing to acknowledge before a request
                    self._refuse(conn, "ACK/NAK before any signed request", wlock)
                    return
                acked = msg.headers.get(REQUEST_ID_HEADER) if msg.method in _ACKS else None
                if acked is not None:  # pipelined: the client read (or not) that reply
                    if carried.pop(acked, 0) is None:  # only a request this connection carried
                        self._acknowledged(msg.method, acked, held_by_id)
                        if msg.method == "NAK":  # it cannot map our segments: stop sending them
                            peer = None
                    continue
                if msg.method in _ACKS:  # the client mapped (or failed to map) it
                    if msg.method == "ACK" and answered and self._delivered is not None:
                        self._delivered(answered)  # proof it has the whole reply
                    if msg.method == "NAK":  # it will ask again with the same id
                        for seg, owner in held:
                            shm.POOL.returned([seg.name], owner)
                        peer = None  # and it cannot map our segments: stop sending them
                    answered = None
                    held.clear()
                    continue
                if answered and self._delivered is not None:
                    self._delivered(answered)
                    answered = None
                length = len(msg.body) if frame else msg.content_length
                descriptor = msg.headers.get(shm.SEGMENT_HEADER)
                if not frame:
                    why, nonce, digest = self._verifier.verify_head(
                        msg.headers.get(AUTH_HEADER),
                        msg.method,
                        msg.path,
                        msg.headers.get(REQUEST_ID_HEADER, ""),
                        msg.headers.get(IDENTITY_HEADER, ""),
                        length,
                        shm.signed_headers(msg.headers),
                    )
                    if why is not None:
                        self._refuse(conn, why, wlock)
                        return
                first = False
                idle = self.idle_timeout
                if PIPELINE_HEADER in msg.headers:
                    pipelined = True  # from now on no request proves an earlier delivery
                    framed = msg.headers[PIPELINE_HEADER] == frames.OFFER
                rid = msg.headers.get(REQUEST_ID_HEADER) if pipelined else None
                if rid is not None:
                    carried[rid] = None
                    if len(carried) > ACKABLE:  # small replies are never ACKed: forget them
                        carried.popitem(last=False)
                wanted = msg.headers.get(IDENTITY_HEADER)
                if wanted and self.identity and wanted != self.identity:
                    text = f"this is {self.identity}, not {wanted}: the address is stale"
                    with wlock:
                        self.write_reply(
                            conn, Reply(409, [text.encode()], "text/plain"), False,
                            nonce=nonce, request_id=rid,
                        )  # fmt: skip
                    return
                if length > self._max_body:
                    text = f"body over {self._max_body} bytes".encode()
                    with wlock:
                        self.write_reply(
                            conn, Reply(413, [text], "text/plain"), False, nonce=nonce,
                            request_id=rid,
                        )  # fmt: skip
                    return
                offered = shm.OFFER_HEADER in msg.headers
                if offered:
                    peer = local_peer(msg)
                if peer is not None and shm.RELEASED_HEADER in msg.headers:
                    shm.take_released(msg.headers[shm.RELEASED_HEADER], peer)
                if descriptor is not None:  # same host, 0600 memfd; the descriptor is signed
                    try:
                        msg.body = shm.open_segment(descriptor, self._max_body)
                    except ProtocolError as exc:
                        refused = Reply(400, [str(exc).encode()], "text/plain")
                        with wlock:
                            self.write_reply(
                                conn, refused, msg.keep_alive, refused=True, nonce=nonce,
                                request_id=rid,
                            )  # fmt: skip
                        continue
                elif not frame:  # a frame's body came (and was checked) with its head
                    if length > len(reader.pending):  # else it is here already
                        reader.set_timeout(BODY_IDLE_TIMEOUT)
                    msg.body = reader.read_body(length)
                    if not self._verifier.keys.body_matches(digest, msg.body):
                        self._refuse(conn, "body does not match its signed digest", wlock)
                        return
                msg.peer = peer
                reply = self._handler(msg)
                msg.body = bytearray()
                # a segment is held before its reply is sent: the client's ACK may come at once
                if rid is not None:
                    hold = lambda seg, p=peer, r=rid: held_by_id.__setitem__(r, (seg, p))  # noqa: E731
                else:
                    hold = lambda seg, p=peer: held.append((seg, p))  # noqa: E731
                if isinstance(reply, Deferred):
                    sender = _Sender(self, conn, wlock, peer, offered, hold, nonce, rid, framed)
                    reply.start(sender.send)
                else:
                    with wlock:
                        self.write_reply(
                            conn, reply, msg.keep_alive, peer, announce=offered, hold=hold,
                            nonce=nonce, request_id=rid, frame=framed,
                        )  # fmt: skip
                reply = None  # sent: do not pin its buffers while the connection idles
                if not pipelined:
                    answered = msg.headers.get(REQUEST_ID_HEADER)
                if not msg.keep_alive:
                    return
        except ProtocolError as exc:
            try:
                with wlock:
                    self.write_reply(conn, Reply(400, [str(exc).encode()], "text/plain"), False)
            except OSError:
                pass
        except OSError:  # includes timeouts: the connection is dropped
            pass
        finally:
            self._forget(conn)
            conn.close()

    def _refuse(self, conn: socket.socket, why: str, wlock: threading.Lock) -> None:
        text = f"request not authenticated ({why}); sign it with the trial secret"
        with wlock:
            self.write_reply(conn, Reply(401, [text.encode()], "text/plain"), False)

    def _acknowledged(self, method: str, request_id: str, held_by_id: dict) -> None:
        """A pipelined client's ``ACK``/``NAK`` for the reply to ``request_id``: ACK proves
        it has the whole reply (and the segment, if any, may be reused); NAK returns the
        segment (the client will ask again with the same id)."""
        entry = held_by_id.pop(request_id, None)
        if method == "ACK":
            if self._delivered is not None:
                self._delivered(request_id)
        elif entry is not None:
            shm.POOL.returned([entry[0].name], entry[1])

    def write_reply(
        self,
        conn: socket.socket,
        reply: Reply,
        keep_alive: bool,
        local: int | None = None,
        refused: bool = False,
        announce: bool = False,
        hold=None,
        nonce: str = "",
        request_id: str | None = None,
        frame: bool = False,
    ) -> shm.Segment | None:
        """Send ``reply`` (the caller holds the connection's write lock); a large one to a
        local peer goes in a segment, and ``hold(segment)`` is called with it before
        anything is sent, so that the caller keeps it until the client acknowledges it.
        ``request_id``: named in the reply (a pipelined connection); ``frame``: its client
        reads binary frames, and a small reply goes as one (``rpc.frames``)."""
        if frame and nonce and request_id is not None and keep_alive and not announce:
            if not refused and frames.send_reply(
                conn, self._verifier.keys, reply, nonce, request_id, local
            ):
                return None
        headers = {"Content-Type": reply.content_type}
        if request_id is not None:
            headers[REQUEST_ID_HEADER] = request_id
        if not keep_alive:
            headers["Connection"] = "close"
        if refused:
            headers[shm.REFUSED_HEADER] = "1"
        status_line = _STATUS_LINES.get(reply.status) or f"HTTP/1.1 {reply.status} Status"
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
        if nonce:  # a reply to an authenticated request proves we hold the secret too
            headers[AUTH_HEADER] = self._verifier.sign_reply(
                reply.status, nonce, reply.content_type, parts, shm.signed_headers(headers)
            )
        send_message(conn, status_line, headers, parts)
        return segment


class _Sender:
    """Writes one deferred reply from the thread that made it; if that fails, the
    connection is ended (its own thread then sees it)."""

    __slots__ = (
        "server", "conn", "lock", "peer", "offered", "hold", "nonce", "request_id", "frame"
    )  # fmt: skip

    def __init__(self, server, conn, lock, peer, offered, hold, nonce, request_id, frame=False):
        self.server, self.conn, self.lock, self.peer = server, conn, lock, peer
        self.offered, self.hold, self.nonce, self.request_id = offered, hold, nonce, request_id
        self.frame = frame

    def send(self, reply: Reply) -> None:
        try:
            with self.lock:
                self.server.write_reply(
                    self.conn, reply, True, self.peer, announce=self.offered, hold=self.hold,
                    nonce=self.nonce, request_id=self.request_id, frame=self.frame,
                )  # fmt: skip
        except OSError:
            _shutdown(self.conn)


def local_peer(msg: Message) -> int | None:
    """The client's pid if it offered shared memory and runs on this host, else None."""
    offer = msg.headers.get(shm.OFFER_HEADER)
    if not offer:
        return None
    token, _, pid = offer.partition(" ")
    if token != shm.host_token() or not token or not pid.isdigit():
        return None
    return int(pid)


def _shutdown(conn: socket.socket) -> None:
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
