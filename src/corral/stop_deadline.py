"""``CORRAL_STOP_DEADLINE``: how long a stopping worker may take before it leaves at once.

Read by the worker when it stops (``worker.ending``), checked by the controller before any
worker starts (``spec`` for a role's ``env_vars``, the scheduler for its own environment).
Below both: it imports only ``os`` and the errors (a stuck worker's stop imports nothing).
"""

from __future__ import annotations

import os

from corral.errors import ConfigError

STOP_DEADLINE_SECONDS = 5.0
STOP_DEADLINE_ENV = "CORRAL_STOP_DEADLINE"


def parse_stop_deadline(raw: str) -> float:
    """Seconds from a ``CORRAL_STOP_DEADLINE`` value; ValueError unless a finite number > 0."""
    value = float(raw)
    if not 0 < value < float("inf"):
        raise ValueError(f"{raw!r} is not a number of seconds > 0")
    return value


def check_stop_deadline(env: dict[str, str], field_name: str) -> None:
    """ConfigError naming ``field_name`` when ``env`` sets a bad ``CORRAL_STOP_DEADLINE``:
    the controller checks before any worker starts (the worker itself can only fall back)."""
    raw = env.get(STOP_DEADLINE_ENV)
    if raw is None:
        return
    try:
        parse_stop_deadline(raw)
    except ValueError:
        raise ConfigError(
            field_name, raw, f"use a number of seconds > 0 (default {STOP_DEADLINE_SECONDS:g})"
        ) from None


def stop_deadline(env: dict[str, str] | None = None) -> float:
    """The deadline in seconds (the default when unset or unreadable)."""
    raw = (env if env is not None else os.environ).get(STOP_DEADLINE_ENV, "")
    try:
        return parse_stop_deadline(raw) if raw else STOP_DEADLINE_SECONDS
    except ValueError:
        return STOP_DEADLINE_SECONDS
