"""The RPC server with a real forked child that dies before it registers (the server in-
process: tests/unit/test_rpc_server.py)."""

from __future__ import annotations

import pytest

from corral.errors import (
    WorkerCreationError,
)
from tests.unit.test_rpc_server import (  # noqa: F401  (fixtures of the unit tests)
    client,
    runtime,
)


def test_forked_child_that_dies_before_registering_is_forgotten(runtime, client) -> None:  # noqa: F811  (the imported fixtures)
    """A dotted module name is allowed (the controller is authenticated); a child that
    exits at once must be reported and forgotten, so the same fork can be retried."""
    payload = {"role": "diesfast", "index": 0, "module": "corral_no_such_module", "timeout": 20}
    for _ in range(2):
        with pytest.raises(WorkerCreationError) as info:
            client.request(runtime.test_address, "/fork", payload)
        assert "exited with code 1 before it registered" in str(info.value)
        assert "diesfast/0" not in runtime.forks.children
