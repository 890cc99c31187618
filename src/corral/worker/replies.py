"""How an engine call is answered: whether it takes the path with refs, and the reply of a
synchronous call queued on the engine thread (the envelope itself: ``rpc.envelope``)."""

from __future__ import annotations

from corral.errors import CorralError
from corral.rpc.envelope import failure, ok


def uses_refs(payload: dict) -> bool:
    """Refs in the arguments (resolved, maybe fetched, first) or a result to keep: such
    calls take the ordinary path through ``_call``."""
    return bool(payload.get("_refs")) or payload.get("keep") is not None


class EngineCallReply:
    """A synchronous engine call queued on the engine thread; it replies itself."""

    __slots__ = ("finish", "request_id", "fn", "send")

    def __init__(self, finish, request_id: str | None, fn, send):
        """``finish(request_id, reply)``: the runtime's result cache takes the reply and
        gives it back; ``send``: the reply goes to the connection."""
        self.finish, self.request_id, self.fn, self.send = finish, request_id, fn, send

    def run(self) -> None:
        try:
            reply = ok(self.fn())
        except Exception as exc:
            reply = failure(500, exc)
        self.send(self.finish(self.request_id, reply))

    def cancel(self) -> None:
        stopping = CorralError("the worker is stopping; the call did not run")
        self.send(self.finish(self.request_id, failure(503, stopping)))
