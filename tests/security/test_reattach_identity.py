"""Re-attach adopts a recorded pid only while it is still the worker (issue 25, attack 4).

Before: a run with ``outlive_controller`` whose controller and worker were SIGKILLed left
the worker's pid in its record; once that pid was reused by an unrelated process X, a new
controller attaching to the run adopted X by number. If X was the same user's, ``close()``
killed X (SIGTERM to its process group); if X was another user's, ``killpg`` got EPERM,
``pid_alive`` took EPERM as "alive", and ``close()`` hung. Now the process is checked
(this user's, and its environment names the worker) and held by a pidfd before it is
adopted; anything else is adopted as a worker that has already exited.

The pid reuse is staged by starting X first and recording its pid as the dead worker's:
what the kernel would do by itself after enough forks.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading

import pytest

from corral import Job
from corral.backends.local import LocalLauncher
from corral.procs import pid_alive
from corral.spec import Worker
from tests.security.support import MALLORY, unix_user


def _stop_returns(launcher: LocalLauncher, role: str, within: float = 30.0) -> bool:
    done = threading.Event()

    def stop() -> None:
        launcher.stop(role)
        done.set()

    threading.Thread(target=stop, daemon=True).start()
    return done.wait(within)


def _dead_worker_at(pid: int) -> Worker:
    return Worker(id="w/0", ip="127.0.0.1", host=socket.gethostname(), pid=pid, port=1)


@pytest.fixture
def other_users_process():
    unix_user(MALLORY)
    proc = subprocess.Popen(
        ["runuser", "-u", MALLORY, "--", "/bin/sh", "-c", "echo $$; exec sleep 300"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    pid = int(proc.stdout.readline())
    yield pid
    proc.kill()
    subprocess.run(["kill", "-9", str(pid)], check=False)
    proc.wait()


def test_a_reused_pid_of_another_user_is_not_adopted(other_users_process, tmp_path) -> None:
    launcher = LocalLauncher(gpu_devices=[])
    launcher.adoption.adopt("w", [_dead_worker_at(other_users_process)], str(tmp_path))
    assert 0 in launcher.poll("w")  # reported as exited, not as a live worker
    assert _stop_returns(launcher, "w"), "close() hung on another user's process"
    assert os.path.exists(f"/proc/{other_users_process}")  # X still runs


def test_a_reused_pid_of_the_same_user_is_never_signalled(tmp_path) -> None:
    x = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        launcher = LocalLauncher(gpu_devices=[])
        launcher.adoption.adopt("w", [_dead_worker_at(x.pid)], str(tmp_path))
        assert 0 in launcher.poll("w")
        assert _stop_returns(launcher, "w")
        assert x.poll() is None  # X was not killed
    finally:
        x.kill()
        x.wait()


def test_the_real_worker_is_still_adopted_and_stopped(local_backend) -> None:
    """The control: a live worker of the run passes the check and is stopped by close()."""
    sched = local_backend.scheduler()
    try:
        sched.create_workers(Job(role="w", replicas=1))
        worker = sched.get_workers("w")[0]
        launcher = LocalLauncher(gpu_devices=[])
        launcher.adoption.adopt("w", [worker], str(sched.log_dir))
        assert launcher.poll("w") == {}
        assert _stop_returns(launcher, "w")
        assert not pid_alive(worker.pid)  # (a zombie until its first controller reaps it)
    finally:
        sched.close()
