"""A worker started with ``die_with_parent`` asks the kernel for SIGTERM when its parent
dies (``prctl(PR_SET_PDEATHSIG)``), and stops at once if that parent is already gone."""

from __future__ import annotations

import _signal  # signal's C module: signal.py loads enum (see worker/runtime.py)
import os

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> str | None:
    """Ask the kernel to SIGTERM this process when its parent dies (Linux only). Returns
    why the worker must stop now (its parent is already gone), else None."""
    import ctypes  # here: a worker that is not asked to die with its parent never loads it

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, _signal.SIGTERM)
    except (OSError, AttributeError):
        return None
    expected = os.environ.get("CORRAL_PARENT_PID")
    if expected and os.getppid() != int(expected):
        return f"parent {expected} is already gone"
    return None
