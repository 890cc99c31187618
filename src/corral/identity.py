"""Is the process at a recorded pid still the one recorded? (PIDs are reused.)

A controller that adopts a dead run's workers (``corral.controller.adoption``) or removes a dead run's
leftovers (``corral.controller.leftovers``) knows them by the pid they registered. By then the
worker may be gone and its pid taken by an unrelated process, of this user or another.
So before adopting, signalling or waiting, the process is checked: it belongs to this
user (``/proc/<pid>`` is ours; another user's process reads as "not ours", never as
"alive"), and its environment, which only its user can read, names the expected worker.
Adoption then holds a pidfd (``procs.AdoptedProcess``), which keeps naming that process
whatever happens to the number.
"""

from __future__ import annotations

import os


def environ(pid: int) -> dict[bytes, bytes] | None:
    """The process's environment, or None if it is gone or not readable by us."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    return dict(item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)


def owned_by_me(pid: int) -> bool:
    try:
        return os.stat(f"/proc/{pid}").st_uid == os.getuid()
    except OSError:
        return False


def matches(pid: int, **expected: str) -> bool:
    """Does ``pid`` run as this user with ``CORRAL_<NAME>=value`` for every
    ``name=value`` given (e.g. ``experiment="e", trial="t", role="r", index="0"``)?"""
    if not owned_by_me(pid):
        return False
    env = environ(pid)
    if env is None:
        return False
    return all(
        env.get(f"CORRAL_{name.upper()}".encode()) == value.encode()
        for name, value in expected.items()
    )
