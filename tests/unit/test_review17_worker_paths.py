"""Review 17: the worker's new short paths keep main's checks: ``Connection.process_frame``
(serve3: a pipelined batch's frames) refuses a body over the server's limit, as
``process`` and the lent connection's ``_lent_frame`` do, on a real in-process worker."""

from __future__ import annotations

from tests.unit.test_frame_batches import _send_together
from tests.unit.test_rpc_server import SECRET, runtime  # noqa: F401  (module fixture)
from tests.unit.test_wire_frames import _call, _Conn


def test_a_pipelined_frame_over_max_body_is_refused_and_not_run(runtime):  # noqa: F811
    """413, and the call does not run (main's ``process`` and ``_lent_frame`` check too)."""
    conn = _Conn(runtime.test_address)
    server = runtime.server
    limit = server.max_body
    before = runtime.engines.call("main", "count", [], {})
    server.max_body = 200
    try:
        _send_together(conn, [_call("echo", "x" * 1000)])
        conn.sock.settimeout(5)
        received = bytearray()
        try:
            while chunk := conn.sock.recv(65536):
                received += chunk
        except TimeoutError:
            pass
    finally:
        server.max_body = limit
        conn.close()
    assert runtime.engines.call("main", "count", [], {}) == before  # the echo did not run
    assert b"413" in received
