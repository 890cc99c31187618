from __future__ import annotations

import os

import pytest

pytest_plugins = [
    "tests.conformance.backend_local",
    "tests.conformance.backend_ray",
    "tests.conformance.backend_slurm",
]


def _say_who_ends_the_run(config) -> None:
    """A run that ends without pytest's summary may be one that ``os._exit`` ended from
    inside: print who called it, with pytest's capture suspended, so the CI log names the
    caller. Only in pytest's own process: a child forked by a test leaves through
    ``os._exit`` on purpose."""
    import sys
    import traceback

    real_exit, pytest_pid = os._exit, os.getpid()
    capture = config.pluginmanager.getplugin("capturemanager")

    def exit_(code: int) -> None:
        if os.getpid() == pytest_pid:
            if capture is not None:
                capture.suspend_global_capture(in_=True)
            stack = "".join(traceback.format_stack()[:-1])
            sys.stderr.write(f"\n[tests] os._exit({code!r}) in the pytest process, from:\n{stack}")
            sys.stderr.flush()
        real_exit(code)

    os._exit = exit_


def pytest_configure(config):
    _say_who_ends_the_run(config)


BACKENDS = [b for b in os.environ.get("CORRAL_TEST_BACKENDS", "local,ray,slurm").split(",") if b]


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.getfixturevalue(f"{request.param}_backend")


@pytest.fixture
def sched(backend):
    scheduler = backend.scheduler()
    yield scheduler
    scheduler.close()
    left = backend.leftovers(scheduler.experiment_name, scheduler.trial_name)
    assert not left, f"left behind after close(): {left}"


def pytest_terminal_summary(terminalreporter, config):
    """The random order's seed, last, even under -q (pytest-randomly prints it only in the
    header, which -q hides): a failure that depends on the order can be replayed."""
    seed = getattr(config.option, "randomly_seed", None)
    if isinstance(seed, int) and config.pluginmanager.has_plugin("randomly"):
        terminalreporter.write_line(
            f"random test order: seed {seed} (replay: python -m pytest --randomly-seed={seed} ...)"
        )
