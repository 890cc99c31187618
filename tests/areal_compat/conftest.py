"""The AReaL compatibility suite needs ``areal==1.0.4`` (installed with ``--no-deps`` plus
the few packages its scheduler and controller modules import; scripts/test.sh does it).
Without it the tests that import AReaL skip on a developer machine and fail in CI."""

from __future__ import annotations

import importlib

import pytest

from tests.conformance.harness import require_service

AREAL_VERSION = "1.0.4"


@pytest.fixture(scope="session")
def areal():
    """AReaL's modules the suite compares against, or skip/fail (CI) without them."""
    try:
        modules = {
            name: importlib.import_module(name)
            for name in (
                "areal.api.scheduler_api",
                "areal.api.cli_args",
                "areal.infra.scheduler.exceptions",
                "areal.infra.scheduler.local",
                "areal.infra.scheduler.ray",
                "areal.infra.scheduler.slurm",
                "areal.infra.controller.train_controller",
                "areal.api.io_struct",
            )
        }
        from importlib.metadata import version

        found = version("areal")
    except Exception as exc:  # ImportError and whatever a partial install raises
        require_service(f"areal=={AREAL_VERSION}", f"{type(exc).__name__}: {exc}")
    if found != AREAL_VERSION:
        pytest.fail(f"the suite pins areal=={AREAL_VERSION}, found {found}")
    return modules
