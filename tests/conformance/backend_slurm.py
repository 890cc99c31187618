from __future__ import annotations

import pytest

from tests.conformance.harness import require_service


@pytest.fixture(scope="session")
def slurm_backend():
    require_service("slurm backend", "not implemented yet")
