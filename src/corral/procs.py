"""Local process trees: start, stop, describe, and check liveness.

Shared by the local backend (workers) and the worker runtime (forked children)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from corral.liveness import pid_alive  # noqa: F401  (importable from here too)

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
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


class AdoptedProcess:
    """A worker process this controller did not start (re-attach, corral.attach): enough
    of ``Popen`` for polling and stopping it. Its exit code is unknown (not our child)."""

    returncode = None
    adopted = True

    def __init__(self, pid: int):
        self.pid = pid

    def poll(self) -> int | None:
        return None if pid_alive(self.pid) else -1

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while pid_alive(self.pid):
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
            time.sleep(0.02)
        return -1
