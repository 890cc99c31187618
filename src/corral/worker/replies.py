"""How an engine call is answered: whether it takes the path with refs, and the reply of a
synchronous call queued on the engine thread (the envelope itself: ``rpc.envelope``)."""

from __future__ import annotations

from corral.errors import CorralError
from corral.rpc.envelope import failure, ok

TYPE_CHECKING = False  # typing's, without importing typing (a worker's start)
if TYPE_CHECKING:
    from typing import Any


def uses_refs(payload: dict) -> bool:
    """Refs in the arguments (resolved, maybe fetched, first) or a result to keep: such
    calls take the ordinary path through ``_call``."""
    return bool(payload.get("_refs")) or payload.get("keep") is not None


class EngineCallReply:
    """A synchronous engine call queued on the engine thread; it replies itself."""

    __slots__ = ("runtime", "request_id", "fn", "send")

    def __init__(self, runtime: Any, request_id: str | None, fn, send):
        self.runtime, self.request_id, self.fn, self.send = runtime, request_id, fn, send

    def run(self) -> None:
        try:
            reply = ok(self.fn())
        except Exception as exc:
            reply = failure(500, exc)
        self.send(self.runtime._finish(self.request_id, reply))

    def cancel(self) -> None:
        stopping = CorralError("the worker is stopping; the call did not run")
        self.send(self.runtime._finish(self.request_id, failure(503, stopping)))
