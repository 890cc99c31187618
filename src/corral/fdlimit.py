"""Open-file budget of the controller process.

Each worker costs the controller file descriptors (``Launcher.fds_per_worker``): a local
worker 2 (its output pipe, and the connection a call fan-out opens to it), a Ray worker 2
(that connection and Ray's channel to its actor), a Slurm worker 1 (the connection); log
files are shared, at most 16 open at once. Measured on real
workers: tests/conformance/test_fd_budget.py, benchmarks/bench_scale.py
(``scale.local_fds_per_worker``).
Before a role starts, the soft ``RLIMIT_NOFILE`` is raised toward the hard limit when
needed (as ``ulimit -n`` would); a role that still cannot fit is refused before anything
starts with :class:`~corral.errors.ResourceLimitError`, never a raw ``OSError: Too many
open files`` halfway through.
"""

from __future__ import annotations

import errno
import logging
import os

from corral.errors import ResourceLimitError

log = logging.getLogger("corral")
MARGIN = 64  # for name-resolve, the RPC pool, logs and the user's own files


def open_fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def ensure_fds(needed: int, what: str) -> None:
    """Make room for ``needed`` more descriptors, or raise ResourceLimitError."""
    try:
        import resource
    except ImportError:  # not POSIX
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = open_fds() + needed + MARGIN
    if soft == resource.RLIM_INFINITY or want <= soft:
        return
    if hard == resource.RLIM_INFINITY or want <= hard:
        new = want if hard == resource.RLIM_INFINITY else min(hard, max(want, 2 * soft))
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        log.info("raised the open-file limit from %d to %d for %s", soft, new, what)
        return
    raise too_many_files(what, needed, soft, hard)


def too_many_files(what: str, needed: int, soft: int, hard: int) -> ResourceLimitError:
    return ResourceLimitError(
        f"{what} needs about {needed} more open files in the controller, but its limit "
        f"(ulimit -n) is {soft} (hard limit {hard}) with {open_fds()} in use; raise it "
        f"(ulimit -n {open_fds() + needed + MARGIN}, or the hard limit in "
        "/etc/security/limits.conf) or start fewer workers"
    )


def is_fd_exhaustion(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE)
