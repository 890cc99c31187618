"""Whether a process of this host still runs (no subprocess machinery: a worker's watch
on its controller imports this at start)."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """True if ``pid`` runs here and is not a zombie waiting to be reaped."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return True
