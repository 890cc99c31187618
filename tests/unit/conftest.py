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


def _refuse(call: str, original, refusals: list, test_side):
    def refused(*args, **kwargs):
        if not test_side():  # a thread of another folder's live fixture (Ray, Slurm, etcd)
            return original(*args, **kwargs)
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
    """While inside: every call that starts a process raises ProcessSpawnedInUnitTest when
    it is made on the test's side: the test's own thread, a thread started during the test,
    or corral's long-lived spawner thread (corral/procs.py) asked by one of those. Threads
    that were already running belong to other folders' session fixtures (a Ray cluster, a
    Slurm scheduler's health monitor) that the random test order interleaves with unit
    tests; they spawn freely. A refusal that a thread swallows still fails the test."""
    refusals: list[str] = []
    before = {t.ident for t in threading.enumerate()} - {threading.get_ident()}

    def test_side() -> bool:
        me = threading.current_thread()
        if me.name.startswith("corral-spawner"):
            return bool(getattr(_spawn_requests, "from_test", False))
        return me.ident not in before

    saved = [(owner, attr, owner.__dict__[attr]) for owner, attr, _ in PATCHED]
    spawner = _corral_spawner()
    outer_submit = spawner.__dict__.get("submit") if spawner is not None else None
    try:
        for (owner, attr, shown), (_, _, original) in zip(PATCHED, saved, strict=True):
            setattr(owner, attr, _refuse(shown, original, refusals, test_side))
        if spawner is not None:
            spawner.submit = _marking_submit(spawner, test_side)
        yield
    finally:
        for owner, attr, original in saved:
            setattr(owner, attr, original)
        if spawner is not None and outer_submit is not None:
            spawner.submit = outer_submit
        elif spawner is not None:
            del spawner.submit
    if refusals:
        raise ProcessSpawnedInUnitTest(refusals[0])


_spawn_requests = threading.local()


def _corral_spawner():
    """corral.procs' spawner pool, if corral.procs is loaded (None otherwise)."""
    import sys

    procs = sys.modules.get("corral.procs")
    return getattr(procs, "_spawner", None)


def _marking_submit(spawner, test_side):
    """``spawner.submit`` that tells the spawner thread whether the test asked."""
    original = type(spawner).submit

    def submit(fn, *args, **kwargs):
        from_test = test_side()

        def marked():
            _spawn_requests.from_test = from_test
            try:
                return fn(*args, **kwargs)
            finally:
                _spawn_requests.from_test = False

        return original(spawner, marked)

    return submit


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
