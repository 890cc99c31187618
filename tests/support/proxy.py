"""A loopback TCP proxy that cuts connections mid-transfer, for fault tests."""

from __future__ import annotations

import socket
import threading

from tests.support.loopback import LoopbackServer


class CuttingProxy(LoopbackServer):
    """Forwards loopback TCP to a worker; the first ``cuts`` connections are closed after
    ``cut_after`` bytes in one direction, every later one passes through untouched.

    ``direction="request"`` counts the bytes the client sends (the worker never sees the
    whole request); ``direction="reply"`` counts the bytes the worker sends back (the
    worker has run the request, the client never sees the whole reply)."""

    def __init__(
        self, target: tuple[str, int], cut_after: int, cuts: int = 1, direction: str = "request"
    ):
        if direction not in ("request", "reply"):
            raise ValueError(f"direction must be 'request' or 'reply', not {direction!r}")
        self.target = target
        self.cut_after = cut_after
        self.cuts = cuts
        self.direction = direction
        self.cut = 0
        self._open: list[socket.socket] = []
        super().__init__()

    def accepted(self, client: socket.socket) -> None:
        limit = self.cut_after if self.connections <= self.cuts else None
        up, down = (limit, None) if self.direction == "request" else (None, limit)
        upstream = socket.create_connection(self.target)
        self._open += [client, upstream]
        threading.Thread(target=self._pipe, args=(client, upstream, up), daemon=True).start()
        threading.Thread(target=self._pipe, args=(upstream, client, down), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, limit: int | None) -> None:
        moved = 0
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                if limit is not None and moved + len(data) > limit:
                    dst.sendall(data[: limit - moved])
                    self.cut += 1
                    break
                dst.sendall(data)
                moved += len(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def reset(self) -> None:
        """Break every connection open now (as a restarted or vanished peer would)."""
        open_now, self._open = self._open, []
        for s in open_now:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def sockets_only(sched, address: str) -> None:
    """Send large bodies to ``address`` over the socket, so a proxy there sees (and can cut)
    them: on one host they would otherwise travel through shared memory."""
    caller = sched.parts.caller
    for client in (caller.client, caller.async_client):
        peers = getattr(client, "shm", None)
        if peers is not None:
            peers.remote.add(address)
