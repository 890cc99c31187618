"""The guard of tests/unit/conftest.py: inside a unit test every way to start a process is
refused with a message that names the call (the calls are refused, so nothing starts)."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import subprocess
import threading

import pytest

from tests.unit.conftest import ProcessSpawnedInUnitTest, no_processes


def test_the_guard_is_on_while_a_unit_test_runs():
    assert subprocess.Popen._execute_child.__name__ == "refused"
    assert os.fork.__name__ == "refused"


@pytest.mark.parametrize(
    "start, call",
    [
        (lambda: subprocess.run(["true"]), "subprocess.Popen"),
        (lambda: os.system("true"), "os.system"),
        (lambda: os.fork(), "os.fork"),
        (lambda: os.posix_spawn("/bin/true", ["true"], {}), "os.posix_spawn"),
        (lambda: multiprocessing.Process(target=print).start(), "multiprocessing Process.start"),
    ],
)
def test_each_way_to_start_a_process_is_refused_by_name(start, call):
    with pytest.raises(ProcessSpawnedInUnitTest, match=f"called {call}.*tests/integration"):
        with no_processes():
            start()


def test_a_refusal_swallowed_in_a_thread_still_fails_the_test():
    def swallow():
        with contextlib.suppress(ProcessSpawnedInUnitTest):
            subprocess.run(["true"])

    with pytest.raises(ProcessSpawnedInUnitTest, match="in thread 'helper'"):
        with no_processes():
            thread = threading.Thread(target=swallow, name="helper")
            thread.start()
            thread.join()


def _spawn_nothing():
    """A spawn call that starts no process when let through (the program does not exist)."""
    os.posix_spawn("/nonexistent/corral-guard-probe", ["probe"], {})


@pytest.fixture
def fixture_thread():
    """A thread started before the test (as another folder's session fixture's would be):
    ``run(fn)`` runs ``fn`` on it and returns what it raised."""
    jobs, results = [], []
    wake = threading.Event()

    def loop():
        while wake.wait(10):
            wake.clear()
            if not jobs:
                return
            try:
                jobs.pop()()
                results.append(None)
            except Exception as exc:
                results.append(exc)

    thread = threading.Thread(target=loop, name="fixture", daemon=True)
    thread.start()

    def run(fn):
        jobs.append(fn)
        wake.set()
        for _ in range(1000):
            if results:
                return results.pop()
            threading.Event().wait(0.01)
        raise AssertionError("the fixture thread did not answer")

    yield run
    wake.set()
    thread.join(10)


def test_a_thread_that_ran_before_the_test_spawns_freely(fixture_thread):
    """Another folder's session fixture (a Ray cluster, a Slurm health monitor) keeps
    threads that may start processes while a unit test runs in the random order: they are
    let through (the probe fails only because its program does not exist)."""
    assert isinstance(fixture_thread(_spawn_nothing), OSError)


def test_the_spawner_thread_is_refused_only_when_the_test_asks(fixture_thread):
    from corral import procs

    with pytest.raises(ProcessSpawnedInUnitTest, match="corral-spawner"):
        with no_processes():
            with contextlib.suppress(ProcessSpawnedInUnitTest):
                procs._spawner.submit(_spawn_nothing).result()
    asked = fixture_thread(lambda: procs._spawner.submit(_spawn_nothing).result())
    assert isinstance(asked, OSError), asked
