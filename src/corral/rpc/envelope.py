"""The envelope every worker reply carries: ``{"ok": True, "result": ...}`` or
``{"ok": False, "error": {type, message, traceback[, owner]}}``. Built here by the worker's
routes (engine calls, data routes), read back by ``rpc.protocol.interpret_reply``."""

from __future__ import annotations

from corral.errors import CorralError
from corral.rpc import wire
from corral.rpc.http import FRAME_TYPE
from corral.rpc.server import Reply

TYPE_CHECKING = False  # typing's, without importing typing (a worker's start)
if TYPE_CHECKING:
    from typing import Any

OK_NONE = b"".join(wire.encode({"ok": True, "result": None}))  # bytes: safe to share


def ok(result: Any = None) -> Reply:
    if result is None:  # many engine methods return nothing: no encoding per call
        return Reply(200, [OK_NONE], FRAME_TYPE)
    return Reply(200, wire.encode({"ok": True, "result": result}), FRAME_TYPE)


def failure(status: int, exc: BaseException) -> Reply:
    error = {"type": type(exc).__name__, "message": str(exc)}
    tb = getattr(exc, "remote_traceback", "") or ""
    if not tb and not isinstance(exc, CorralError):
        try:
            import traceback  # on failures only: not part of a worker's start
        except (ImportError, OSError):  # out of descriptors (the import opens files)
            traceback = None
        tb = "" if traceback is None else traceback.format_exc()
    error["traceback"] = tb
    if getattr(exc, "owner", None):
        error["owner"] = exc.owner
    return Reply(status, wire.encode({"ok": False, "error": error}), FRAME_TYPE)
