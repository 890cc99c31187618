"""A worker started to die with its parent (``CORRAL_DIE_WITH_PARENT=1``, as the local
backend and forks start theirs) stops when that parent is killed, and does not start when
its parent is already gone: ``worker/parent_death.py`` (a pidfd of the parent, watched by
a thread; issue 29 took ``ctypes`` out of every worker's start for it).

The worker's controller lease is long (60 s) and the controller pid it watches is this
test's, alive: only the parent watch can end it within the test's few seconds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from corral.liveness import pid_alive
from tests.support.standalone_worker import standalone_worker_env

#: the parent: starts the worker as the local backend does (CORRAL_PARENT_PID, its own
#: session), prints the worker's pid once it registered, then waits to be killed
PARENT = r"""
import os, subprocess, sys, time
env = dict(os.environ, CORRAL_PARENT_PID=str(os.getpid()))
if len(sys.argv) > 1:
    env["CORRAL_PARENT_PID"] = sys.argv[1]  # a parent that is not this process: gone
worker = subprocess.Popen([sys.executable, "-m", "corral.worker"], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          start_new_session=True)
seen = b""
for line in worker.stdout:
    seen += line
    if b"serving at" in line or b"stopping" in line:
        break
print(worker.pid, flush=True)
sys.stderr.write(seen.decode(errors="replace"))
if len(sys.argv) > 1:
    print(worker.wait(30), flush=True)
time.sleep(600)
"""


def _environment(tmp_path) -> dict[str, str]:
    return standalone_worker_env(tmp_path, "parent", lease_timeout=60.0)


def _start_parent(tmp_path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", PARENT, *args],
        env=_environment(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(30)
    proc.stdout.close()
    proc.stderr.close()


def test_a_worker_stops_when_the_parent_it_dies_with_is_killed(tmp_path):
    parent = _start_parent(tmp_path)
    worker = 0
    try:
        worker = int(parent.stdout.readline())
        assert pid_alive(worker)
        time.sleep(0.3)
        assert pid_alive(worker)  # its parent lives: it serves on
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(30)
        deadline = time.monotonic() + 10
        while pid_alive(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not pid_alive(worker), "the worker outlived the parent it dies with"
    finally:
        _stop(parent)
        if worker and pid_alive(worker):
            os.killpg(worker, signal.SIGKILL)


@pytest.mark.parametrize("how", ["dead", "reused"])
def test_a_worker_whose_parent_is_already_gone_stops_after_registering(tmp_path, how):
    """``CORRAL_PARENT_PID`` names a process that is not the worker's parent (its parent
    died before the worker looked): a pid no process has (no pidfd: the kernel's
    signal and the same check), or one another live process has now (this test's): the
    worker stops at once instead of serving on."""
    if how == "dead":
        gone_proc = subprocess.Popen([sys.executable, "-c", "pass"])
        gone_proc.wait()
        gone = gone_proc.pid
    else:
        gone = os.getpid()
    parent = _start_parent(tmp_path, str(gone))
    try:
        worker = int(parent.stdout.readline())
        code = int(parent.stdout.readline())
        assert code == 0, f"the worker ended with {code}"
        assert not pid_alive(worker)
    finally:
        _stop(parent)
