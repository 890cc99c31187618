"""An ``http.server`` handler class served behind the gate (``corral.rpc.gate``), within a
budget of its own: for the Prometheus endpoint and the dashboard.

``ThreadingHTTPServer`` starts a thread per connection and times out per read, so a peer
that trickles a header line now and then holds a thread and a descriptor for as long as
it likes; 1,000 of them took a controller's descriptors and with them its lease. Here:

* a connection waits in the gate, without a thread, until it has sent its whole head, at
  most ``head_timeout`` after connecting; waiting ones are capped per peer and in total
  (the oldest is dropped for a new one);
* the head is then judged in the gate's thread (``judge(method, path, headers)``):
  ``None`` is answered ``401`` at once, without a thread; ``"public"`` (the dashboard's
  static page) and ``"private"`` (authorized) requests get a handler thread from two
  separate pools (``max_public``, ``max_private``), so that no number of unauthorized
  requests can take a slot an authorized one needs; over a pool's size, ``503``;
* a handler's reads and writes are bounded by ``io_timeout`` each, and it serves one
  request (HTTP/1.0: the connection is closed after it).

So the descriptors and threads a surface can ever cost its process are bounded by
``max_waiting + max_public + max_private`` (plus the listening socket and the gate's
thread), whatever the peers do.
"""

from __future__ import annotations

import io
import logging
import socket
import threading
from collections.abc import Callable

from corral.rpc.gate import HeadGate

log = logging.getLogger("corral")
Judge = Callable[[str, str, dict], "str | None"]
PUBLIC, PRIVATE = "public", "private"


def parse_request_head(head: bytes) -> tuple[str, str, dict[str, str]]:
    """Method, target and lower-cased headers of a request head (``("", "", {})`` when
    it is malformed)."""
    text = head.split(b"\r\n\r\n", 1)[0].decode("latin-1")
    first, *lines = text.split("\r\n")
    parts = first.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        return "", "", {}
    headers: dict[str, str] = {}
    for line in lines:
        name, sep, value = line.partition(":")
        if not sep:
            return "", "", {}
        headers[name.strip().lower()] = value.strip()
    return parts[0], parts[1], headers


def _canned(status: str, body: bytes, extra: str = "") -> bytes:
    return (
        f"HTTP/1.0 {status}\r\nContent-Type: text/plain; charset=utf-8\r\n{extra}"
        f"Content-Length: {len(body)}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n"
    ).encode() + body


class _Request:
    """The connection as the handler sees it: its first read returns the head the gate
    already read; writes go to the socket."""

    def __init__(self, conn: socket.socket, head: bytes):
        self.conn, self.head = conn, head

    def makefile(self, mode: str, *args, **kwargs):
        if "r" in mode:
            return io.BytesIO(self.head)
        return self.conn.makefile(mode, *args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.conn, name)


class GuardedHTTPServer:
    """Serves ``handler_class`` (a ``BaseHTTPRequestHandler``) on ``address``; the same
    surface as ``ThreadingHTTPServer`` as far as corral uses it."""

    def __init__(
        self,
        address: tuple[str, int],
        handler_class: type,
        judge: Judge,
        *,
        name: str,
        unauthorized: bytes = b"unauthorized\n",
        www_authenticate: str = "",
        max_waiting: int = 64,
        max_waiting_per_peer: int = 32,
        max_public: int = 4,
        max_private: int = 16,
        io_timeout: float = 30.0,
        head_timeout: float = 10.0,
    ):
        self.handler_class = handler_class
        self.judge = judge
        self.io_timeout = io_timeout
        self.socket = socket.create_server(address, backlog=128)
        self.server_address = self.socket.getsockname()
        self.daemon_threads = True  # (ThreadingHTTPServer's attribute: always so here)
        self._pools = {
            PUBLIC: threading.BoundedSemaphore(max_public),
            PRIVATE: threading.BoundedSemaphore(max_private),
        }
        extra = f"WWW-Authenticate: {www_authenticate}\r\n" if www_authenticate else ""
        self._refused = _canned("401 Unauthorized", unauthorized, extra)
        self._busy = _canned("503 Service Unavailable", b"busy, retry\n", "Retry-After: 1\r\n")
        self._stopped = threading.Event()
        self.gate = HeadGate(
            self.socket, self._dispatch, name=name, head_timeout=head_timeout,
            max_waiting=max_waiting, max_waiting_per_peer=max_waiting_per_peer,
        )  # fmt: skip
        self._started = False

    # ----------------------------------------------------------- ThreadingHTTPServer API
    def serve_forever(self) -> None:
        self._start()
        self._stopped.wait()

    def _start(self) -> None:
        if not self._started:
            self._started = True
            self.gate.start()

    def shutdown(self) -> None:
        self._stopped.set()
        self.gate.close()

    def server_close(self) -> None:
        self.socket.close()

    # ----------------------------------------------------------- serving
    def _dispatch(self, conn: socket.socket, head: bytes, peer: str) -> None:
        method, target, headers = parse_request_head(head)
        kind = self.judge(method, target, headers) if method else None
        if kind is None:
            self._answer(conn, self._refused)
            return
        pool = self._pools[kind]
        if not pool.acquire(blocking=False):
            self._answer(conn, self._busy)
            return
        try:
            threading.Thread(
                target=self._handle, args=(conn, head, peer, pool), name="corral-http",
                daemon=True,
            ).start()  # fmt: skip
        except RuntimeError:  # no thread left
            pool.release()
            self._answer(conn, self._busy)

    def _answer(self, conn: socket.socket, reply: bytes) -> None:
        """A short canned reply from the gate's thread: never blocks it."""
        try:
            conn.setblocking(False)
            conn.send(reply)
            conn.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        conn.close()

    def _handle(
        self, conn: socket.socket, head: bytes, peer: str, pool: threading.BoundedSemaphore
    ) -> None:
        try:
            conn.settimeout(self.io_timeout)
            self.handler_class(_Request(conn, head), (peer, 0), self)
        except Exception as exc:  # a broken client: only its connection ends
            log.debug("http handler: %s", exc)
        finally:
            pool.release()
            try:
                conn.close()
            except OSError:
                pass
