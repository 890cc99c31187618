"""The blocking client's per-call timeout on a pooled keep-alive connection: each call
gets its own (the client sets the socket's timeout only when it changes, issue 29). A
real in-process RPC server; no process started."""

from __future__ import annotations

import threading

import pytest

from corral.rpc import wire
from corral.rpc.client import RPCClient
from corral.rpc.server import Reply, RPCServer

SECRET = "s" * 64


@pytest.fixture
def address():
    done = threading.Event()  # set at teardown: no handler sleeps on after the test

    def sleepy(msg) -> Reply:
        delay = wire.decode(msg.body).get("delay", 0)
        done.wait(delay)
        return Reply(200, wire.encode({"ok": True, "result": delay}))

    server = RPCServer(SECRET, sleepy, host="127.0.0.1").start()
    yield f"127.0.0.1:{server.port}"
    done.set()
    server.stop()


def test_a_timeout_applies_on_a_connection_reused_from_an_untimed_call(address):
    client = RPCClient(SECRET)
    try:
        assert client.request(address, "/x", {"delay": 0}) == 0  # pooled, no timeout
        with pytest.raises(TimeoutError, match="within 0.3s"):
            client.request(address, "/x", {"delay": 3}, timeout=0.3)
    finally:
        client.close()


def test_no_timeout_applies_on_a_connection_reused_from_a_timed_call(address):
    client = RPCClient(SECRET)
    try:
        assert client.request(address, "/x", {"delay": 0}, timeout=1.5) == 0
        # the same pooled connection, no timeout: a reply later than the last call's 1.5 s
        assert client.request(address, "/x", {"delay": 2.0}) == 2.0
    finally:
        client.close()
