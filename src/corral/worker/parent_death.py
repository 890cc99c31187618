"""A worker started with ``die_with_parent`` gets SIGTERM when its parent dies, and stops at
once if that parent is already gone.

Two ways to the same signal: ``watch_parent`` (a worker) waits on a pidfd of its parent
in a thread of its own and sends itself SIGTERM when the parent ends; ``die_with_parent``
(the fork template, which forks and so keeps to one thread; and a worker where pidfds are
missing) asks the kernel for it with ``prctl(PR_SET_PDEATHSIG)``, which needs ``ctypes``
(~2.5 ms of CPU in every local worker right after it registers, while the workers started
beside it still start: issue 29)."""

from __future__ import annotations

import _signal  # signal's C module: signal.py loads enum (see worker/runtime.py)
import os
import select
import threading

_PR_SET_PDEATHSIG = 1


def _parent() -> int:
    """The pid this process must die with: the launcher's (``CORRAL_PARENT_PID``), else
    the parent it has."""
    expected = os.environ.get("CORRAL_PARENT_PID")
    return int(expected) if expected else os.getppid()


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


def watch_parent() -> str | None:
    """SIGTERM to this process when its parent ends, as ``die_with_parent`` has the kernel
    send it, from a daemon thread that waits on a pidfd of the parent. Returns why the
    worker must stop now (its parent is already gone), else None."""
    parent = _parent()
    try:
        pidfd = os.pidfd_open(parent)
    except (AttributeError, OSError):  # no pidfds here (Linux < 5.3, not Linux)
        return die_with_parent()
    # opened first, checked second: a parent alive now is the process the pidfd refers to
    if os.getppid() != parent:
        os.close(pidfd)
        return f"parent {parent} is already gone"
    threading.Thread(
        target=_terminate_when_ended, args=(pidfd,), name="corral-parent", daemon=True
    ).start()
    return None


def _terminate_when_ended(pidfd: int) -> None:
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)  # readable once the process has ended
    while not poller.poll():
        pass
    os.kill(os.getpid(), _signal.SIGTERM)
