"""How an engine call is answered: whether it takes the path with refs, and the reply of a
synchronous call queued on the engine thread (the envelope itself: ``rpc.envelope``)."""

from __future__ import annotations

from time import perf_counter

from corral.errors import CorralError
from corral.rpc.envelope import failure, ok

#: an engine method whose last run took less than this is quick: a batch of pipelined
#: calls sends the replies before it only after it (``worker.engine_thread.Batch``)
QUICK_SECONDS = 0.0005
_LAST_RUN: dict = {}  # (engine name, method) -> seconds its last run took


def uses_refs(payload: dict) -> bool:
    """Refs in the arguments (resolved, maybe fetched, first) or a result to keep: such
    calls take the ordinary path through ``_call``."""
    return bool(payload.get("_refs")) or payload.get("keep") is not None


class EngineCallReply:
    """A synchronous engine call queued on the engine thread; it replies itself, then (on a
    one-request-at-a-time connection) serves that connection's next request there too."""

    __slots__ = ("finish", "request_id", "fn", "send", "lease", "park", "method")

    def __init__(
        self, finish, request_id: str | None, fn, send, lease=None, park=None, method=None
    ):  # fmt: skip
        """``finish(request_id, reply)``: the runtime's result cache takes the reply and
        gives it back; ``send``: the reply goes to the connection. ``lease``: the
        connection lent to the engine thread (``rpc.connection.Lease``), or None;
        ``park``: ``EngineHost.park``, how the engine thread waits on it. ``method``:
        ``(engine name, method name)``, to remember how long it takes (``quick``)."""
        self.finish, self.request_id, self.fn, self.send = finish, request_id, fn, send
        self.lease, self.park, self.method = lease, park, method

    @property
    def quick(self) -> bool:
        """Did this engine method's last run take less than ``QUICK_SECONDS``?"""
        return _LAST_RUN.get(self.method, QUICK_SECONDS) < QUICK_SECONDS

    def run(self) -> None:
        try:
            started = perf_counter()
            try:
                reply = ok(self.fn())
            except Exception as exc:
                reply = failure(500, exc)
            if self.method is not None:
                if len(_LAST_RUN) >= 4096:  # names made on the fly: stay bounded
                    _LAST_RUN.clear()
                _LAST_RUN[self.method] = perf_counter() - started
            self.send(self.finish(self.request_id, reply))
        except BaseException:
            if self.lease is not None:  # never leave the connection's thread waiting
                self.lease.give_back()
            raise
        if self.lease is not None:
            self.lease.serve_here(self.park)

    def cancel(self) -> None:
        stopping = CorralError("the worker is stopping; the call did not run")
        self.send(self.finish(self.request_id, failure(503, stopping)))
        if self.lease is not None:
            self.lease.give_back()
