from __future__ import annotations

import os

import pytest

pytest_plugins = [
    "tests.conformance.backend_local",
    "tests.conformance.backend_ray",
    "tests.conformance.backend_slurm",
]

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
