"""One authenticated connection of the worker's RPC server: what it remembers between
requests, what one message does (``Connection.process``), and the lease by which the engine
thread serves a one-request-at-a-time connection's next engine call itself.

The lease: a synchronous engine call's reply is made on the engine thread
(``rpc.server.Deferred`` with ``lends``). On a connection that is not pipelined, the client
sends nothing before it has that reply, so instead of its own thread waiting in ``recv``
for the next request (and handing it to the engine thread, a wake-up and a GIL hand-over
per call), the connection is lent to the engine thread: after the reply, while nothing else
is queued for it, the engine thread polls the socket briefly (``rpc.spin``: work queued
meanwhile waits at most that bound), then waits on it (``EngineThread.park``) and reads,
checks, runs and answers the next ``lendable`` request there (a synchronous engine call,
with nothing queued, runs right there: ``_SERVED``, and it reads on). It gives the connection back
(and the connection's thread reads on) when work is queued from elsewhere, when the next
message is anything else or not all there yet, after ``PARK_SECONDS`` of quiet, or on any
error. Engine calls stay on the one engine thread; only the reading moves.
"""

from __future__ import annotations

import _socket  # socket's C module: socket.py loads enum (a worker's start)
import threading
from collections import OrderedDict

from corral.errors import ProtocolError
from corral.rpc import frames, shm, spin
from corral.rpc.http import (
    IDENTITY_HEADER,
    PIPELINE_HEADER,
    REQUEST_ID_HEADER,
    Message,
    SocketReader,
    parse_head,
)
from corral.rpc.lease import Lease
from corral.rpc.reply import Deferred, Reply
from corral.rpc.reply_sender import ReplySender
from corral.rpc.unsent import Unsent

_ACKS = ("ACK", "NAK")
#: request ids a pipelined connection remembers for their ACK (the client ACKs at once)
ACKABLE = 4096
#: how long the engine thread waits on a quiet lent connection before giving it back (at
#: most the server's ``idle_timeout``)
PARK_SECONDS = 1.0
#: the largest body the engine thread reads for a lent connection (larger: its own thread)
LENT_BODY = 64 * 1024
_NOT_MINE = object()
#: ``process`` on the engine thread: the reply was made and sent there, the lease kept
_SERVED = object()
#: the engine thread's poll for a lent connection's next request before it parks
#: (``rpc.spin``; one engine thread per worker, so one state)
_SPINNER = spin.Spinner()


class Connection:
    """The state of one connection between its messages. Its thread calls ``process`` for
    each message it reads; while it is lent, only the engine thread does."""

    def __init__(self, server, sock: _socket.socket, head: bytes = b""):
        """``server``: the ``rpc.server.RPCServer`` it belongs to (its limits, its
        signature checks, its handler and ``write_reply``)."""
        self.server = server
        self.sock = sock
        self.reader = SocketReader(sock, kernel_timeouts=True)
        self.reader.pending += head  # the first head, read by the gate
        self.answered: str | None = None
        self.held: list = []  # a reply's segment, kept until the client has mapped it
        self.held_by_id: dict[str, tuple] = {}  # the same on a pipelined connection
        self.carried: OrderedDict[str, None] = OrderedDict()  # signed requests an ACK may name
        self.pipelined = False
        self.framed = False  # the client offered binary frames (``rpc.frames``)
        self.wlock = threading.Lock()  # one reply at a time on the socket
        self.peer: int | None = None  # the client's pid once it offered shared memory
        self.idle = server.head_timeout  # a new connection must send its first head promptly
        self.first = True
        self.unsent = Unsent(sock, self.wlock)  # reply frames of batches, sent together
        self.out: Unsent | None = None  # while a batch is read (``RPCServer._serve_frames``)
        self.probe = Message("FRAME", {})  # a lent request frame's path, to ask ``lendable``
        self.probe.method = "POST"

    def process(
        self, msg, lease: Lease | None = None, frame_nonce: str | None = None
    ) -> bool | Lease:
        """One message read from the connection (on its thread, or on the engine thread
        with the ``lease`` it holds). False: the connection ends; True: it goes on; a
        ``Lease``: it goes on, lent to the engine thread with the reply's task; ``_SERVED``
        (only with a ``lease``): answered on the engine thread, which keeps the lease.
        ``frame_nonce``: ``msg`` is a binary frame (``rpc.frames``), already verified whole
        and replay-checked, with this nonce."""
        if lease is not None and frame_nonce is not None and not self.pipelined:
            return self._lent_frame(msg, lease, frame_nonce)
        server = self.server
        if self.first and msg.method in _ACKS:  # nothing to acknowledge before a request
            server.refuse(self.sock, "ACK/NAK before any signed request", self.wlock)
            return False
        acked = msg.headers.get(REQUEST_ID_HEADER) if msg.method in _ACKS else None
        if acked is not None:  # pipelined: the client read (or not) that reply
            if self.carried.pop(acked, 0) is None:  # only a request this connection carried
                server.acknowledged(msg.method, acked, self.held_by_id)
                if msg.method == "NAK":  # it cannot map our segments: stop sending them
                    self.peer = None
            return True
        if msg.method in _ACKS:  # the client mapped (or failed to map) it
            if msg.method == "ACK" and self.answered:
                server.delivered(self.answered)  # proof it has the whole reply
            if msg.method == "NAK":  # it will ask again with the same id
                for seg, owner in self.held:
                    shm.POOL.returned([seg.name], owner)
                self.peer = None  # and it cannot map our segments: stop sending them
            self.answered = None
            self.held.clear()
            return True
        if self.answered:
            server.delivered(self.answered)
            self.answered = None
        frame = frame_nonce is not None
        length = len(msg.body) if frame else msg.content_length
        descriptor = msg.headers.get(shm.SEGMENT_HEADER)
        if frame:
            nonce, digest = frame_nonce, ""
            if not self.pipelined:  # a frame of a one-request-at-a-time connection
                del msg.headers[PIPELINE_HEADER]
        else:
            why, nonce, digest = server.verify_head(msg, length)
            if why is not None:
                server.refuse(self.sock, why, self.wlock)
                return False
        self.first = False
        self.idle = server.idle_timeout
        if PIPELINE_HEADER in msg.headers:
            self.pipelined = True  # from now on no request proves an earlier delivery
            self.framed = msg.headers[PIPELINE_HEADER] == frames.OFFER
        elif not self.framed and msg.headers.get(frames.OFFER_HEADER) == frames.OFFER:
            self.framed = True  # one request at a time, with frames (``rpc.frames``)
        rid = msg.headers.get(REQUEST_ID_HEADER) if self.pipelined else None
        if rid is not None:
            self.carried[rid] = None
            if len(self.carried) > ACKABLE:  # small replies are never ACKed: forget them
                self.carried.popitem(last=False)
            reply_id = rid
        else:  # a reply frame names its request (a text reply needs no id here)
            reply_id = msg.headers.get(REQUEST_ID_HEADER, "") if self.framed else None
        if self._refused(msg.headers.get(IDENTITY_HEADER), length, nonce, rid):
            return False
        offered = shm.OFFER_HEADER in msg.headers
        if offered:
            self.peer = local_peer(msg)
        peer = self.peer
        if peer is not None and shm.RELEASED_HEADER in msg.headers:
            shm.take_released(msg.headers[shm.RELEASED_HEADER], peer)
        if descriptor is not None:  # same host, 0600 memfd; the descriptor is signed
            try:
                msg.body = shm.open_segment(descriptor, server.max_body)
            except ProtocolError as exc:
                self.write(400, str(exc), msg.keep_alive, nonce, rid, refused=True)
                return True
        elif not frame:  # a frame's body came (and was checked) with its head
            if length > len(self.reader.pending):  # else it is here already
                self.reader.set_timeout(server.body_idle_timeout)
            msg.body = self.reader.read_body(length)
            if not server.body_matches(digest, msg.body):
                server.refuse(self.sock, "body does not match its signed digest", self.wlock)
                return False
        msg.peer = peer
        keep_alive = msg.keep_alive
        reply = server.handler(msg)
        msg.body = bytearray()
        # a segment is held before its reply is sent: the client's ACK may come at once
        if rid is not None:
            hold = lambda seg, p=peer, r=rid: self.held_by_id.__setitem__(r, (seg, p))  # noqa: E731
        else:
            hold = lambda seg, p=peer: self.held.append((seg, p))  # noqa: E731
        if not self.pipelined:  # set before the reply can go: a lent connection's engine
            self.answered = msg.headers.get(REQUEST_ID_HEADER)  # thread may read on at once
        lent = None
        if isinstance(reply, Deferred):
            sender = ReplySender(
                server, self.sock, self.wlock, peer, offered, hold, nonce, reply_id, self.framed,
                self.out if reply.lends else None,  # a batch's: its replies leave together
            )  # fmt: skip
            if not reply.lends:
                reply.start(sender.send)
            else:
                if rid is None and keep_alive:  # one request at a time: lend it
                    lent = lease or Lease(self)
                reply.start(sender.send, lent)
        else:
            with self.wlock:
                server.write_reply(
                    self.sock, reply, keep_alive, peer, announce=offered, hold=hold,
                    nonce=nonce, request_id=reply_id, frame=self.framed,
                )  # fmt: skip
            if lease is not None and keep_alive:
                return _SERVED
        reply = None  # sent: do not pin its buffers while the connection idles
        return lent or keep_alive

    def _lent_frame(self, msg, lease: Lease, nonce: str) -> bool | Lease:
        """``process`` of a request frame read by the engine thread on a lent connection
        (one request at a time, frames offered, its first requests done): the same steps,
        less those a frame cannot need (ACKs, signed heads, shared-memory offers and
        descriptors, a body still to read)."""
        server, headers = self.server, msg.headers
        if self.answered:  # the client has the last reply
            server.delivered(self.answered)
            self.answered = None
        del headers[PIPELINE_HEADER]
        request_id = headers[REQUEST_ID_HEADER]
        if self._refused(headers[IDENTITY_HEADER], len(msg.body), nonce, None):
            return False
        peer = msg.peer = self.peer
        reply = server.handler(msg)
        msg.body = bytearray()
        hold = lambda seg, p=peer: self.held.append((seg, p))  # noqa: E731
        self.answered = request_id  # before the reply can go: the next request may follow
        if isinstance(reply, Deferred):
            sender = ReplySender(
                server, self.sock, self.wlock, peer, False, hold, nonce, request_id, True, None
            )
            if reply.lends:
                reply.start(sender.send, lease)
                return lease
            reply.start(sender.send)
            return True
        out: list = []
        with self.wlock:  # as a frame if one can carry it (``write_reply``'s first choice)
            if frames.reply_frame(out, server.keys, reply, nonce, request_id, peer):
                self.sock.sendall(out[0])
            else:
                server.write_reply(
                    self.sock, reply, True, peer, hold=hold, nonce=nonce,
                    request_id=request_id, frame=True,
                )  # fmt: skip
        return _SERVED

    def process_frame(self, msg: Message, nonce: str) -> bool:
        """``process`` of a request frame of a batch (``RPCServer._serve_frames``), on a
        pipelined connection that has carried a signed request: verified and
        replay-checked already, it carries no shared-memory header and no ACK, so only
        the steps such a frame takes are taken. False: the connection ends."""
        server = self.server
        self.idle = server.idle_timeout
        headers = msg.headers
        rid = headers[REQUEST_ID_HEADER]
        carried = self.carried
        carried[rid] = None
        if len(carried) > ACKABLE:  # small replies are never ACKed: forget them
            carried.popitem(last=False)
        if self._refused(headers[IDENTITY_HEADER], len(msg.body), nonce, rid):
            return False
        msg.peer = peer = self.peer
        reply = server.handler(msg)
        msg.body = bytearray()
        if type(reply) is Deferred:
            out = self.out if reply.lends else None  # a batch's: its replies leave together
            sender = ReplySender(
                server, self.sock, self.wlock, peer, False, None, nonce, rid, True, out
            )
            sender.connection = self
            if reply.lends:
                reply.start(sender.send, None)
            else:
                reply.start(sender.send)
            return True
        with self.wlock:
            server.write_reply(
                self.sock, reply, True, peer, hold=self._holder(peer, rid), nonce=nonce,
                request_id=rid, frame=True,
            )  # fmt: skip
        return True

    def _refused(self, wanted: str | None, length: int, nonce, rid) -> bool:
        """Answer 409 (a request for another worker: a stale address) or 413 (a body over
        the server's limit) and say so; the connection then ends."""
        server = self.server
        if wanted and server.identity and wanted != server.identity:
            text = f"this is {server.identity}, not {wanted}: the address is stale"
            self.write(409, text, False, nonce, rid)
            return True
        if length > server.max_body:
            self.write(413, f"body over {server.max_body} bytes", False, nonce, rid)
            return True
        return False

    def _holder(self, peer, rid):
        """What keeps a reply's segment until the client ACKs request ``rid``."""
        return lambda seg: self.held_by_id.__setitem__(rid, (seg, peer))

    def write(self, status, text, keep_alive, nonce, rid, refused=False) -> None:
        reply = Reply(status, [text.encode()], "text/plain")
        with self.wlock:
            self.server.write_reply(
                self.sock, reply, keep_alive, refused=refused, nonce=nonce, request_id=rid
            )

    # ------------------------------------------------------------ lent to the engine thread
    def serve_here(self, lease: Lease, park) -> None:
        """On the engine thread, right after it sent this connection's reply: serve its next
        lendable requests until the connection must go back to its own thread."""
        quiet = min(PARK_SECONDS, self.idle)  # the connection's own idle limit still holds
        reader = self.reader
        try:
            while not self.server.stopping:
                msg = self._next_lendable() if reader.pending else None
                if msg is _NOT_MINE:
                    break
                if msg is None:  # nothing (whole) yet: wait for it, or for other work
                    # a poll only before a request's first byte: the rest of one that came
                    # in part goes through ``park``, which yields to queued work at once
                    if (
                        not reader.pending
                        and _SPINNER.bound
                        and (chunk := _SPINNER.recv(self.sock, LENT_BODY))
                    ):
                        reader.pending += chunk
                        continue
                    if not park(self.sock.fileno(), quiet) or not self._receive():
                        break
                    continue
                nonce = None
                if type(msg) is bytearray:  # a whole request frame: verified here
                    msg, why, nonce = self.server.open_frame(msg)
                    if why is not None:
                        self.server.refuse(self.sock, why, self.wlock)
                        lease.give_back(ended=True)
                        return
                went_on = self.process(msg, lease, nonce)
                if went_on is _SERVED:  # a synchronous call run right here: read on
                    continue
                if not went_on:
                    lease.give_back(ended=True)
                    return
                if went_on is lease:  # its reply is queued on the engine thread: so is the lease
                    return
                break
        except BaseException as exc:  # the connection's thread raises it (and ends it)
            lease.give_back(error=exc)
            return
        lease.give_back()

    def _next_lendable(self):
        """The next request if it is whole in the buffer and may run here (its head taken
        from the buffer; a request frame is taken whole, as a bytearray, not yet
        verified); None if it is not all there yet; ``_NOT_MINE`` otherwise."""
        pending = self.reader.pending
        if pending and pending[0] == frames.FRAME_BYTE:
            return self._next_frame(pending)
        end = pending.find(b"\r\n\r\n")
        if end < 0:
            return None if len(pending) < LENT_BODY else _NOT_MINE
        try:
            msg = parse_head(bytes(pending[:end]))
            length = msg.content_length
        except ProtocolError:  # its own thread reads it again and answers 400
            return _NOT_MINE
        if (
            PIPELINE_HEADER in msg.headers
            or not msg.keep_alive
            or length > LENT_BODY
            or not self.server.lendable(msg)
        ):
            return _NOT_MINE
        if shm.SEGMENT_HEADER not in msg.headers and len(pending) < end + 4 + length:
            return None
        del pending[: end + 4]
        return msg

    def _next_frame(self, pending: bytearray):
        """``_next_lendable`` for a request frame (on a connection that offered frames)."""
        if not self.framed:  # its own thread reads it and answers 400
            return _NOT_MINE
        if len(pending) < frames.HEAD_START:
            return None
        try:
            size = frames.request_size(pending)
        except ProtocolError:
            return _NOT_MINE
        if len(pending) < size:
            return None
        probe = self.probe  # which thread: by its path (checked later)
        probe.path = frames.request_path(pending)
        if not self.server.lendable(probe):
            return _NOT_MINE
        frame = pending[:size]
        del pending[:size]
        return frame

    def _receive(self) -> bool:
        """Take what the socket has (without waiting); False if it is closed or broken."""
        try:
            chunk = self.sock.recv(LENT_BODY, _socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            return False
        if not chunk:
            return False
        self.reader.pending += chunk
        return True


def local_peer(msg) -> int | None:
    """The client's pid if it offered shared memory and runs on this host, else None."""
    offer = msg.headers.get(shm.OFFER_HEADER)
    if not offer:
        return None
    token, _, pid = offer.partition(" ")
    if token != shm.host_token() or not token or not pid.isdigit():
        return None
    return int(pid)
