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
