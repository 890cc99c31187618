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

What one message on a connection does, and how a one-request-at-a-time connection is lent
to the engine thread between engine calls: ``corral.rpc.connection``. The binary request
frames one receive brings on a pipelined connection are handled as one batch
(``_serve_frames``): each checked on its own, the handler's work handed on together, the
replies sent together.
"""

from __future__ import annotations

import _socket  # socket's C module: socket.py loads enum (a worker's start)
import os
import threading
from collections.abc import Callable

from corral.auth import AUTH_HEADER, RequestVerifier, TrialKeys
from corral.errors import ProtocolError
from corral.rpc import frames, shm
from corral.rpc.connection import Connection
from corral.rpc.gate import HeadGate, warn
from corral.rpc.http import (
    IDENTITY_HEADER,
    REASONS,
    REQUEST_ID_HEADER,
    Message,
    send_message,
    tune_socket,
)
from corral.rpc.reply import Deferred, Reply
from corral.rpc.reply_sender import shutdown

__all__ = ["Deferred", "RPCServer", "Reply"]

DEFAULT_MAX_BODY = 8 * 1024**3
HEAD_TIMEOUT = 10.0
IDLE_TIMEOUT = 300.0
BODY_IDLE_TIMEOUT = 60.0
MAX_CONNECTIONS = 512
MAX_UNAUTHENTICATED = 64
_STATUS_LINES = {code: f"HTTP/1.1 {code} {reason}" for code, reason in REASONS.items()}


Handler = Callable[[Message], "Reply | Deferred"]


def _never(_msg: Message) -> bool:
    return False


class Listener(_socket.socket):
    """A listening socket of ``_socket``, socket.py's C module, with socket.py's
    ``accept``: a worker's start does not load ``socket.py`` and with it ``enum``
    (issue 29). The connections it accepts are ``_socket.socket`` objects."""

    __slots__ = ()

    def accept(self) -> tuple[_socket.socket, object]:
        fd, address = self._accept()
        return _socket.socket(self.family, self.type, self.proto, fileno=fd), address


def listen(host: str, port: int) -> Listener:
    """A listening TCP socket on ``host:port``, as ``socket.create_server((host, port),
    backlog=512)`` makes it (IPv4, ``SO_REUSEADDR``; the same error on a failed bind)."""
    sock = Listener(_socket.AF_INET, _socket.SOCK_STREAM)
    try:
        sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:  # create_server's words: which address could not be bound
            raise OSError(
                exc.errno, f"{exc.strerror} (while attempting to bind on address {(host, port)!r})"
            ) from None
        sock.listen(512)
    except BaseException:
        sock.close()
        raise
    return sock


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
        lendable: Callable[[Message], bool] | None = None,
        batches=None,
    ):
        """``delivered(request_id)`` is called when the client sends its next request on
        the same connection: proof that it read the whole reply to that one.
        ``lendable(msg)``: may the engine thread holding a lent connection read, check and
        handle this request itself (``rpc.connection``)? Default: none."""
        self._verifier = RequestVerifier(TrialKeys(secret))
        self.identity = identity
        self._delivered = delivered
        self.handler = handler
        self.max_body = max_body
        self.body_idle_timeout = BODY_IDLE_TIMEOUT
        self.lendable = lendable or _never
        self.batches = batches
        self.head_timeout = head_timeout
        self.idle_timeout = idle_timeout
        self.max_connections = max_connections
        self.max_unauthenticated = max_unauthenticated
        self._sock = listen(host, port)
        self.port: int = self._sock.getsockname()[1]
        self.stopping = False
        self._conns: set[_socket.socket] = set()
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
            self._sock.shutdown(_socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        with self._lock:
            for conn in list(self._conns):
                shutdown(conn)

    # -------------------------------------------------------------- accepting
    def _admit(self, conn: _socket.socket, head: bytes, _peer: str) -> None:
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

    def _forget(self, conn: _socket.socket) -> None:
        with self._lock:
            self._conns.discard(conn)

    def _serve(self, conn: _socket.socket, head: bytes = b"") -> None:
        c = Connection(self, conn, head)
        try:
            while not self.stopping:
                nonce = None
                if c.framed and c.reader.peek(c.idle) == frames.FRAME_BYTE:
                    batch = c.pipelined and self.batches is not None  # one at a time: lendable
                    if batch and frames.request_ready(c.reader.pending):
                        done = self._serve_frames(c)
                        if done is None:
                            return
                        rest = c.reader.pending  # nothing, or a frame not all here yet
                        if not rest or rest[0] == frames.FRAME_BYTE:
                            c.unsent.watch(done)  # its replies leave together (rpc.unsent)
                        continue
                    # verified whole (one MAC over head and body) and replay-checked
                    msg, why, nonce = frames.read_request(
                        c.reader, self._verifier, self.head_timeout
                    )
                    if why is not None:
                        self.refuse(conn, why, c.wlock)
                        return
                else:
                    msg = c.reader.read_head(c.idle, self.head_timeout)
                if msg is None or not msg.method:
                    return
                went_on = c.process(msg, frame_nonce=nonce)
                if not went_on:
                    return
                if went_on is not True:  # lent to the engine thread: wait until it is back
                    went_on.wait()
                    if went_on.ended:
                        return
                    if went_on.error is not None:
                        raise went_on.error
        except ProtocolError as exc:
            try:
                with c.wlock:
                    self.write_reply(conn, Reply(400, [str(exc).encode()], "text/plain"), False)
            except OSError:
                pass
        except OSError:  # includes timeouts: the connection is dropped
            pass
        finally:
            self._forget(conn)
            conn.close()

    def _serve_frames(self, c: Connection) -> threading.Event | None:
        """Every whole request frame already received, in order, as one batch: the engine
        calls among them reach the engine thread together (one wake-up), and their reply
        frames gather in ``c.unsent`` (``rpc.unsent``). Each frame is verified and
        replay-checked on its own; one refused ends the connection (those before it were
        verified and run, as if they had come alone). The batch's ``done`` (set once it
        has run and its replies went), or None: the connection ends."""
        reader, batches = c.reader, self.batches
        batches.hold()
        unsent = c.out = c.unsent
        sent = threading.Event()
        why = None
        try:
            pending, verifier, process = reader.pending, self._verifier, c.process_frame
            while (taken := frames.take_ready(pending, verifier)) is not None:
                msg, why, nonce = taken
                if why is not None or not process(msg, nonce):
                    return None
            return sent
        finally:
            c.out = None
            batches.release(unsent.settle, sent.set)
            if why is not None:  # the replies of the frames before it go first
                sent.wait(self.head_timeout)
                self.refuse(c.sock, why, c.wlock)

    # what a Connection asks of its server ------------------------------------
    def verify_head(self, msg: Message, length: int) -> tuple:
        """``RequestVerifier.verify_head`` of a request: (why refused or None, nonce, body
        digest)."""
        return self._verifier.verify_head(
            msg.headers.get(AUTH_HEADER),
            msg.method,
            msg.path,
            msg.headers.get(REQUEST_ID_HEADER, ""),
            msg.headers.get(IDENTITY_HEADER, ""),
            length,
            shm.signed_headers(msg.headers),
        )

    def open_frame(self, frame: bytearray) -> tuple:
        """``frames.open_request`` of a whole request frame: (message or None, why refused
        or None, nonce)."""
        if type(frame) is bytearray:  # a lent connection's (``Connection._next_frame``)
            return frames.take_request(frame, self._verifier)
        return frames.open_request(frame, self._verifier)

    @property
    def keys(self) -> TrialKeys:
        return self._verifier.keys

    def body_matches(self, digest: str, body) -> bool:
        return self._verifier.keys.body_matches(digest, body)

    def delivered(self, request_id: str) -> None:
        """The client has the whole reply to ``request_id``."""
        if self._delivered is not None:
            self._delivered(request_id)

    def refuse(self, conn: _socket.socket, why: str, wlock: threading.Lock) -> None:
        text = f"request not authenticated ({why}); sign it with the trial secret"
        with wlock:
            self.write_reply(conn, Reply(401, [text.encode()], "text/plain"), False)

    def acknowledged(self, method: str, request_id: str, held_by_id: dict) -> None:
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
        conn: _socket.socket,
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
