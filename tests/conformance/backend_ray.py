from __future__ import annotations

import pytest

from tests.conformance.harness import require_service


@pytest.fixture(scope="session")
def ray_backend():
    require_service("ray backend", "not implemented yet")
