"""tests/unit starts no process: a unit test that spawns one fails, naming the call.

Every way a test could start a process ends in one of the calls patched here:
``subprocess.Popen`` (and so ``subprocess.run``, ``check_output``, ``os.popen``, asyncio's
subprocesses, Ray and etcd starting), ``os.fork``/``forkpty``/``posix_spawn``/``system``
(and so ``os.spawn*`` and ``pty.fork``), and ``multiprocessing``'s ``Process.start`` (and so
its pools and ``ProcessPoolExecutor``). The guard is on while a unit test's fixtures are
set up, while it runs and while its fixtures are torn down; it is off for the rest of the
session, so tests in other folders (tests/integration, tests/conformance ...) spawn freely
in any order. A test that needs a process belongs in tests/integration.
"""

from __future__ import annotations

import contextlib
import multiprocessing.process
import os
import subprocess
import threading

import pytest

WHY = (
    "tests/unit starts no process, but this test called {call}. "
    "Move it to tests/integration/ (a file named for what it tests), "
    "or test the logic without a process."
)


class ProcessSpawnedInUnitTest(AssertionError):
    """A unit test tried to start a process."""


def _refuse(call: str, refusals: list):
    def refused(*args, **kwargs):
        message = WHY.format(call=f"{call} (in thread {threading.current_thread().name!r})")
        refusals.append(message)
        raise ProcessSpawnedInUnitTest(message)

    return refused


# (owner, attribute, name shown in the failure)
PATCHED = [
    (subprocess.Popen, "_execute_child", "subprocess.Popen"),
    (multiprocessing.process.BaseProcess, "start", "multiprocessing Process.start"),
    *[
        (os, name, f"os.{name}")
        for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system")
        if hasattr(os, name)
    ],
]


@contextlib.contextmanager
def no_processes():
    """While inside: every call that starts a process raises ProcessSpawnedInUnitTest, in
    every thread: corral starts workers from one long-lived spawner thread
    (corral/procs.py), so a thread that ran before the test may spawn on its behalf. A
    refusal that a thread swallows still fails the test on the way out."""
    refusals: list[str] = []
    saved = [(owner, attr, owner.__dict__[attr]) for owner, attr, _ in PATCHED]
    try:
        for owner, attr, shown in PATCHED:
            setattr(owner, attr, _refuse(shown, refusals))
        yield
    finally:
        for owner, attr, original in saved:
            setattr(owner, attr, original)
    if refusals:
        raise ProcessSpawnedInUnitTest(refusals[0])


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    with no_processes():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    with no_processes():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    if nextitem is None:
        # the session's last test also tears down session fixtures that other folders'
        # tests set up (a Ray cluster, etcd): those may run a process to stop
        return (yield)
    with no_processes():
        return (yield)
