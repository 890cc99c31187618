"""Writing a deferred reply from the thread that made it (the engine thread, a slow-call
thread): as a reply frame when the request came as one, else through the server's
``write_reply``; a failed write ends the connection, whose own thread then sees it."""

from __future__ import annotations

import _socket  # socket's C module: socket.py loads enum (a worker's start)

from corral.rpc import frames


class ReplySender:
    """Writes one deferred reply from the thread that made it; if that fails, the
    connection is ended (its own thread then sees it)."""

    __slots__ = (
        "server", "conn", "lock", "peer", "offered", "hold", "nonce", "request_id", "frame",
        "out", "connection",
    )  # fmt: skip

    def __init__(self, server, conn, lock, peer, offered, hold, nonce, request_id, frame, out):
        """``hold`` None: ``connection._holder`` makes it when a reply needs one."""
        self.server, self.conn, self.lock, self.peer = server, conn, lock, peer
        self.offered, self.hold, self.nonce, self.request_id = offered, hold, nonce, request_id
        self.frame, self.out, self.connection = frame, out, None

    def send(self, reply) -> None:
        out = self.out
        if out is not None and frames.reply_frame(
            out, self.server.keys, reply, self.nonce, self.request_id, self.peer
        ):
            return
        hold = self.hold
        if hold is None:
            hold = self.connection._holder(self.peer, self.request_id)
        try:
            with self.lock:
                self.server.write_reply(
                    self.conn, reply, True, self.peer, announce=self.offered, hold=hold,
                    nonce=self.nonce, request_id=self.request_id, frame=self.frame,
                )  # fmt: skip
        except OSError:
            shutdown(self.conn)


def shutdown(conn: _socket.socket) -> None:
    try:
        conn.shutdown(_socket.SHUT_RDWR)
    except OSError:
        pass
