"""A TCP server on loopback, the base of the tests' fake peers and proxies: each accepted
connection goes to ``accepted`` on the accept thread, which by default serves it on a
thread of its own."""

from __future__ import annotations

import socket
import threading


class LoopbackServer:
    """Listens on 127.0.0.1 (a free port) from construction until ``close()``.

    Subclasses set their own attributes before calling ``super().__init__()``: the accept
    thread starts at once."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            self.accepted(conn)

    def accepted(self, conn: socket.socket) -> None:
        threading.Thread(target=self.serve, args=(conn,), daemon=True).start()

    def serve(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.sock.close()
