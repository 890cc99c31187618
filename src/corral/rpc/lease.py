"""A connection lent to the engine thread (``rpc.connection``): the connection's own thread
waits until the engine thread gives it back, exactly once per lease."""

from __future__ import annotations

import _thread


class Lease:
    """A connection lent to the engine thread: its own thread waits in ``wait`` until the
    engine thread gives it back (exactly once per lease)."""

    __slots__ = ("connection", "ended", "error", "_back")

    def __init__(self, connection):
        self.connection = connection
        self.ended = False
        self.error: BaseException | None = None
        self._back = _thread.allocate_lock()
        self._back.acquire()

    def serve_here(self, park) -> None:
        """``park(fd, timeout)``: how the engine thread waits (``EngineHost.park``)."""
        self.connection.serve_here(self, park)

    def give_back(self, ended: bool = False, error: BaseException | None = None) -> None:
        self.ended, self.error = ended, error
        self._back.release()

    def wait(self) -> None:
        self._back.acquire()
