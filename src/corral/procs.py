"""Local process trees: start, stop, describe, and check liveness.

Shared by the local backend (workers) and the worker runtime (forked children)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from corral.liveness import pid_alive  # noqa: F401  (importable from here too)

TYPE_CHECKING = False  # typing's, without importing typing (a worker's first fork)
if TYPE_CHECKING:
    from typing import Any

_spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="corral-spawner")


def spawn(
    argv: list[str], env: dict[str, str], pass_fds: tuple[int, ...] = (), stdout: Any = None
) -> subprocess.Popen:
    """Start a worker in its own session, output piped, from one long-lived thread.

    The worker asks the kernel for SIGTERM when its parent *thread* dies, so spawning from a
    short-lived thread would kill it early; the single spawner thread lives with the process.
    """
    full_env = dict(os.environ)
    full_env.update(env)
    full_env["CORRAL_PARENT_PID"] = str(os.getpid())

    def start() -> subprocess.Popen:
        return subprocess.Popen(
            argv,
            env=full_env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if stdout is None else stdout,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            pass_fds=pass_fds,
        )

    return _spawner.submit(start).result()


def describe_returncode(returncode: int) -> str:
    """``"killed by SIGKILL"`` for a negative (Popen) return code, else ``"exited with code N"``."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name}"
    return f"exited with code {returncode}"


def stop_process_groups(procs: list[subprocess.Popen], grace: float = 3.0) -> None:
    """SIGTERM each process group, wait up to ``grace`` seconds together, then SIGKILL."""
    _signal_groups(procs, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    _signal_groups(procs, signal.SIGKILL)
    for proc in procs:
        proc.wait()


def _signal_groups(procs: list[subprocess.Popen], sig: int) -> None:
    for proc in procs:
        signal_group = getattr(proc, "signal_group", None)
        if signal_group is not None:  # held by a pidfd: only while it is still that process
            signal_group(sig)
            continue
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


class AdoptedProcess:
    """A worker process this controller did not start (re-attach, corral.controller.adoption): enough
    of ``Popen`` for polling and stopping it. Its exit code is unknown (not our child).

    Held by a pidfd, opened only after ``is_it(pid)`` confirmed the process is the worker
    (``corral.identity``): polling, waiting and signalling then address that process and
    no other, even once its pid is reused. A pid that was not the worker (gone, reused by
    another process, another user's) is adopted as a process that has already exited:
    it is never signalled nor waited for."""

    returncode = None
    adopted = True

    def __init__(self, pid: int, is_it: Callable[[int], bool]):
        self.pid = pid
        self._pidfd: int | None = None
        try:
            fd = os.pidfd_open(pid)
        except OSError:  # gone (ESRCH)
            return
        # checked after the pidfd exists: while it is alive, the pid is still its own
        if is_it(pid) and not _exited(fd, 0):
            self._pidfd = fd
        else:
            os.close(fd)

    def poll(self) -> int | None:
        return None if self._pidfd is not None and not _exited(self._pidfd, 0) else -1

    def wait(self, timeout: float | None = None) -> int:
        if self._pidfd is not None and not _exited(self._pidfd, timeout):
            raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
        return -1

    def signal_group(self, sig: int) -> None:
        """``sig`` to its process group (its session: the worker and what it started),
        only while the pidfd's process lives (so the group id is still its own)."""
        if self.poll() is None:
            signal_group_by_pidfd(self._pidfd, self.pid, sig)

    def __del__(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


def signal_group_by_pidfd(pidfd: int, pid: int, sig: int) -> None:
    """``sig`` to a session leader held by ``pidfd`` (so to that process, never one that
    took its pid), then to its process group; the caller checked it is alive."""
    try:
        signal.pidfd_send_signal(pidfd, sig)
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _exited(pidfd: int, timeout: float | None) -> bool:
    """Has the pidfd's process exited (within ``timeout`` seconds; None: wait)?"""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(None if timeout is None else int(timeout * 1000)))
