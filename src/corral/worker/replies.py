"""The envelopes a worker answers with: ``{"ok": True, "result": ...}`` or an error."""

from __future__ import annotations

import traceback
from typing import Any

from corral.errors import CorralError, ProtocolError
from corral.rpc import wire
from corral.rpc.http import FRAME_TYPE
from corral.rpc.server import Reply


def ok(result: Any = None) -> Reply:
    return Reply(200, wire.encode({"ok": True, "result": result}), FRAME_TYPE)


def failure(status: int, exc: BaseException) -> Reply:
    error = {"type": type(exc).__name__, "message": str(exc)}
    tb = getattr(exc, "remote_traceback", "") or ""
    if not tb and not isinstance(exc, CorralError):
        tb = traceback.format_exc()
    error["traceback"] = tb
    if getattr(exc, "owner", None):
        error["owner"] = exc.owner
    if isinstance(exc, CorralError) and not isinstance(exc, ProtocolError) and status == 500:
        status = 500
    return Reply(status, wire.encode({"ok": False, "error": error}), FRAME_TYPE)
