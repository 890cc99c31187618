"""The door of every HTTP surface corral opens: connections wait here, without a thread,
until they have sent a whole request head.

One selector thread accepts and reads. A connection is handed on (``dispatch``) only once
it has sent a complete head (up to the blank line), and it must do so within
``head_timeout`` of connecting: a whole-head deadline, so a peer that trickles one byte
every few seconds is dropped all the same. Waiting connections cost one descriptor each
and no thread, and they are capped per peer address and in total; over a cap the oldest
waiting one (of that peer, else of all) is dropped for the new one, so a flood of idle
connections can never keep out a client that sends its request at once. When ``accept``
runs out of descriptors the oldest waiting connection is dropped and the loop backs off.

A peer is an address or, on loopback (where every local user has the address 127.0.0.1),
the local user who owns the client's socket (``peer_uid``): one user's flood only ever
pushes out that user's own waiting connections.

Used by the worker's RPC server (``corral.rpc.server``, the relay's routes included), the
Prometheus endpoint and the dashboard (``corral.observe.http_guard``).
"""

from __future__ import annotations

import _socket  # socket's C module: socket.py loads enum (a worker's start)
import errno
import select
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from corral.rpc.peer_uid import peer_uid


def warn(text: str, *args: object) -> None:
    """A warning of the server; ``logging`` is imported only when there is one (a
    worker's start is lean). Out of file descriptors that import fails (it opens the
    module's files), so the warning then goes to stderr as it is: it must never end the
    loop that reports it."""
    try:
        import logging
    except (ImportError, OSError):
        try:
            sys.stderr.write(f"corral: {text % args}\n")
        except (OSError, ValueError):
            pass
        return
    logging.getLogger("corral").warning(text, *args)


HEAD_TIMEOUT = 10.0
MAX_HEAD_BYTES = 64 * 1024
_FD_ERRORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
_END = b"\r\n\r\n"

#: ``dispatch(conn, head_bytes, peer_address)``: must not block (start a thread, or refuse)
Dispatch = Callable[[_socket.socket, bytes, str], None]


def _peer_of(conn: _socket.socket, address: object) -> str:
    """Who a cap "per peer" counts: the client's user on a loopback connection (every
    local user shares 127.0.0.1), else its address."""
    host = address[0] if isinstance(address, tuple) else str(address)
    if host.startswith("127.") or host in ("::1", "::ffff:127.0.0.1"):
        uid = peer_uid(conn)
        if uid is not None:
            return f"uid {uid}"
    return host


class _Waiting:
    __slots__ = ("conn", "peer", "deadline", "data")

    def __init__(self, conn: _socket.socket, peer: str, deadline: float):
        self.conn, self.peer, self.deadline, self.data = conn, peer, deadline, bytearray()


class HeadGate:
    """Accepts on ``sock`` and dispatches each connection with its complete first head."""

    def __init__(
        self,
        sock: _socket.socket,
        dispatch: Dispatch,
        *,
        name: str,
        head_timeout: float = HEAD_TIMEOUT,
        max_waiting: int = 64,
        max_waiting_per_peer: int = 32,
        max_head_bytes: int = MAX_HEAD_BYTES,
    ):
        self.sock = sock
        self.dispatch = dispatch
        self.head_timeout = head_timeout
        self.max_waiting = max_waiting
        self.max_waiting_per_peer = max_waiting_per_peer
        self.max_head_bytes = max_head_bytes
        self.dropped = 0  # waiting connections dropped (cap, deadline, size): for tests
        self.fd_exhausted = 0  # times accept() ran out of descriptors
        self._waiting: OrderedDict[int, _Waiting] = OrderedDict()  # by fd, oldest first
        self._per_peer: dict[str, int] = {}
        self._closed = False
        # select.poll, not selectors' DefaultSelector: the same readiness for ~70
        # descriptors without selectors.py (a worker's start, issue 29). A descriptor is
        # unregistered before it is closed or handed on (poll keeps closed ones: POLLNVAL)
        self._poll = select.poll()
        self._wake_r, self._wake_w = _socket.socketpair()
        sock.setblocking(False)
        self._listening, self._wake = sock.fileno(), self._wake_r.fileno()
        self._poll.register(self._listening, select.POLLIN)
        self._poll.register(self._wake, select.POLLIN)
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def start(self) -> HeadGate:
        self._thread.start()
        return self

    def close(self) -> None:
        self._closed = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    # ------------------------------------------------------------------ the loop
    def _loop(self) -> None:
        try:
            while not self._closed:
                timeout = self._next_timeout()
                if self._paused:  # out of descriptors with nothing to drop: wait, then retry
                    left = self._resume - time.monotonic()
                    if left <= 0:
                        self._poll.register(self._listening, select.POLLIN)
                        self._paused = False
                    else:
                        timeout = min(timeout, left)
                for fd, _ in self._poll.poll(timeout * 1000):  # ms, rounded up
                    if fd == self._listening:
                        self._accept()
                    elif fd != self._wake:
                        self._read(fd)
                self._expire(time.monotonic())
        finally:
            for fd in list(self._waiting):
                self._drop(fd)
            self._wake_r.close()
            self._wake_w.close()

    def _next_timeout(self) -> float:
        if not self._waiting:
            return 1.0
        first = next(iter(self._waiting.values()))
        return max(0.0, min(1.0, first.deadline - time.monotonic()))

    _paused = False
    _resume = 0.0
    _backoff = 0.0

    def _accept(self) -> None:
        for _ in range(16):  # a burst, then back to reading
            try:
                conn, address = self.sock.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if self._closed or exc.errno not in _FD_ERRORS:
                    return
                self.fd_exhausted += 1
                if self.fd_exhausted == 1 or self.fd_exhausted % 100 == 0:
                    warn("accept: %s; dropping a waiting connection", exc)
                if self._drop_oldest(None):
                    continue  # a descriptor is free again: the next accept can take it
                # nothing of ours to drop: back off (10 ms doubling to 1 s), keep the rest
                self._backoff = min(max(self._backoff * 2, 0.01), 1.0)
                self._resume = time.monotonic() + self._backoff
                self._poll.unregister(self._listening)
                self._paused = True
                return
            self._backoff = 0.0
            self._admit(conn, _peer_of(conn, address))

    def _admit(self, conn: _socket.socket, peer: str) -> None:
        if self._per_peer.get(peer, 0) >= self.max_waiting_per_peer:
            self._drop_oldest(peer)
        if len(self._waiting) >= self.max_waiting:
            self._drop_oldest(None)
        conn.setblocking(False)
        entry = _Waiting(conn, peer, time.monotonic() + self.head_timeout)
        fd = conn.fileno()
        self._waiting[fd] = entry
        self._per_peer[peer] = self._per_peer.get(peer, 0) + 1
        self._poll.register(fd, select.POLLIN)
        self._read(fd)  # a client that sent its request with the connection is served now

    def _read(self, fd: int) -> None:
        entry = self._waiting.get(fd)
        if entry is None:
            return
        try:
            chunk = entry.conn.recv(self.max_head_bytes + 4 - len(entry.data))
        except BlockingIOError:
            return
        except OSError:
            self._drop(fd)
            return
        if not chunk:
            self._drop(fd)
            return
        entry.data += chunk
        if entry.data.find(_END) >= 0:
            self._release(fd)
            try:
                entry.conn.setblocking(True)
                self.dispatch(entry.conn, bytes(entry.data), entry.peer)
            except Exception as exc:  # never let one connection end the loop
                warn("serving a connection: %s", exc)
                entry.conn.close()
        elif len(entry.data) > self.max_head_bytes:
            text = f"HTTP head longer than {self.max_head_bytes} bytes".encode()
            try:  # best effort: the socket is non-blocking and the reply small
                entry.conn.send(
                    b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Type: "
                    b"text/plain\r\nContent-Length: %d\r\n\r\n%s" % (len(text), text)
                )
            except OSError:
                pass
            self._drop(fd)

    def _expire(self, now: float) -> None:
        while self._waiting:
            fd, entry = next(iter(self._waiting.items()))
            if entry.deadline > now:
                return
            self._drop(fd)

    def _drop_oldest(self, peer: str | None) -> bool:
        """Make room: the oldest waiting connection (of ``peer``, if given) is read once
        more (its head may have just arrived: then it is served) or else dropped. False
        when there was none."""
        for fd, entry in self._waiting.items():
            if peer is None or entry.peer == peer:
                self._read(fd)
                if fd in self._waiting:
                    self._drop(fd)
                return True
        return False

    def _release(self, fd: int) -> _Waiting | None:
        entry = self._waiting.pop(fd, None)
        if entry is None:
            return None
        left = self._per_peer.get(entry.peer, 1) - 1
        if left:
            self._per_peer[entry.peer] = left
        else:
            self._per_peer.pop(entry.peer, None)
        try:
            self._poll.unregister(fd)
        except KeyError:
            pass
        return entry

    def _drop(self, fd: int) -> None:
        entry = self._release(fd)
        if entry is not None:
            self.dropped += 1
            try:
                entry.conn.close()
            except OSError:
                pass
