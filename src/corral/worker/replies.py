"""The envelopes a worker answers with: ``{"ok": True, "result": ...}`` or an error."""

from __future__ import annotations

from corral.errors import CorralError
from corral.rpc import wire
from corral.rpc.http import FRAME_TYPE
from corral.rpc.server import Reply

TYPE_CHECKING = False  # typing's, without importing typing (a worker's start)
if TYPE_CHECKING:
    from typing import Any

_OK_NONE = b"".join(wire.encode({"ok": True, "result": None}))  # bytes: safe to share


def ok(result: Any = None) -> Reply:
    if result is None:  # many engine methods return nothing: no encoding per call
        return Reply(200, [_OK_NONE], FRAME_TYPE)
    return Reply(200, wire.encode({"ok": True, "result": result}), FRAME_TYPE)


def failure(status: int, exc: BaseException) -> Reply:
    error = {"type": type(exc).__name__, "message": str(exc)}
    tb = getattr(exc, "remote_traceback", "") or ""
    if not tb and not isinstance(exc, CorralError):
        import traceback  # on failures only: not part of a worker's start

        tb = traceback.format_exc()
    error["traceback"] = tb
    if getattr(exc, "owner", None):
        error["owner"] = exc.owner
    return Reply(status, wire.encode({"ok": False, "error": error}), FRAME_TYPE)


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
