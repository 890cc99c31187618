"""The worker's watch on its controller: it exits when the controller is gone."""

from __future__ import annotations

import _socket  # socket's C module: socket.py loads enum (a worker's start)
import time

from corral import cjson, name_resolve_keys
from corral.liveness import pid_alive

TYPE_CHECKING = False  # typing's, without importing typing (a worker's start)
if TYPE_CHECKING:
    from typing import Any


class ControllerWatch:
    """Exits the worker when its controller is gone: its pid (same host) or its lease."""

    def __init__(self, runtime: Any, on_lost):
        self.runtime = runtime
        self.on_lost = on_lost
        s = runtime.settings
        self.key = name_resolve_keys.controller_key(s.experiment, s.trial)

    def run(self) -> None:
        s = self.runtime.settings
        same_host = s.controller_pid and s.controller_host == _socket.gethostname()
        last_value, last_change = None, time.monotonic()
        # workers asked to outlive their controller (corral.controller.adoption) wait for its lease only
        outlive = getattr(s, "outlive", 0.0)
        grace = outlive
        while not self.runtime.stopped.wait(0.5):
            if not grace and same_host and not pid_alive(s.controller_pid):
                return self.on_lost(f"controller pid {s.controller_pid} is gone")
            try:
                value = self.runtime.name_resolve.get(self.key)
            except Exception as exc:  # unreadable (store down, record forged) counts as stale
                if time.monotonic() - last_change > s.lease_timeout + grace:
                    return self.on_lost(_unreadable(exc, s.lease_timeout + grace))
                continue
            if value is None:
                return self.on_lost("controller lease removed")
            owner, lease_grace = _lease_fields(value)
            grace = max(outlive, lease_grace)
            mine = getattr(s, "run_id", "")
            if mine and owner and owner != mine:
                return self.on_lost(
                    f"the trial's lease now belongs to run {owner}, not this worker's run "
                    f"{mine} (a new controller took over the trial)"
                )
            if value != last_value:
                last_value, last_change = value, time.monotonic()
            elif time.monotonic() - last_change > s.lease_timeout + grace:
                return self.on_lost(
                    f"controller lease not renewed for {s.lease_timeout + grace:.0f}s"
                    + (f" (lease timeout + {grace:g}s grace to re-attach)" if grace else "")
                )


def _unreadable(exc: Exception, seconds: float) -> str:
    return f"controller lease unreadable for {seconds:.0f}s ({type(exc).__name__}: {exc})"


def _lease_fields(raw: str) -> tuple[str, float]:
    """The run id and the re-attach grace period written in a controller lease."""
    try:
        value = cjson.loads(raw)
    except ValueError:
        return "", 0.0
    if not isinstance(value, dict):
        return "", 0.0
    try:
        grace = max(0.0, float(value.get("grace", 0.0) or 0.0))
    except (TypeError, ValueError):
        grace = 0.0
    return str(value.get("run_id", "")), grace
