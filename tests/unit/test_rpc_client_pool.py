"""The async client's connection pool against a real in-process RPC server: a bounded
number of connections per worker however many calls are in flight, no slot lost to a
cancelled or timed-out call, and request ids that stay unique across fork."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from corral.rpc import wire
from corral.rpc.client import AsyncRPCClient
from corral.rpc.server import Reply, RPCServer

SECRET = "s" * 64


class CountingServer:
    """An RPCServer whose handler echoes ``n`` (after ``delay`` if asked) and records how
    many connections it served (one server thread each) and how many were open at once."""

    def __init__(self):
        self.threads: set[int] = set()
        self.peak = 0
        self._lock = threading.Lock()
        self.server = RPCServer(SECRET, self.handle, host="127.0.0.1").start()
        self.address = f"127.0.0.1:{self.server.port}"

    @property
    def accepted(self) -> int:
        return len(self.threads)

    def handle(self, msg) -> Reply:
        with self._lock:
            self.threads.add(threading.get_ident())
            self.peak = max(self.peak, len(self.server._conns))
        payload = wire.decode(msg.body)
        if payload.get("delay"):
            time.sleep(payload["delay"])
        return Reply(200, wire.encode({"ok": True, "result": payload.get("n")}))

    def stop(self):
        self.server.stop()


@pytest.fixture
def server():
    s = CountingServer()
    yield s
    s.stop()


# pipelining=False: every call takes a pooled connection of its own (what large requests
# do); True: small calls share the pipelined connection (corral.rpc.pipeline)
@pytest.mark.parametrize("pipelining", [False, True])
def test_a_fan_out_of_many_calls_uses_at_most_max_connections(server, pipelining):
    client = AsyncRPCClient(SECRET, max_connections=3, pipelining=pipelining)

    async def main():
        results = await asyncio.gather(
            *(client.request(server.address, "/call", {"n": i}) for i in range(300))
        )
        open_now = client.connections()
        await client.aclose()
        return results, open_now

    results, open_now = asyncio.run(main())
    assert results == list(range(300))
    assert server.accepted <= 3, f"{server.accepted} connections for one worker"
    assert server.peak <= 3
    assert open_now <= 3


@pytest.mark.parametrize("pipelining", [False, True])
def test_cancelled_and_timed_out_calls_give_their_connection_slot_back(server, pipelining):
    client = AsyncRPCClient(SECRET, max_connections=2, pipelining=pipelining)

    async def main():
        slow = [
            asyncio.ensure_future(client.request(server.address, "/call", {"n": i, "delay": 0.5}))
            for i in range(6)
        ]
        await asyncio.sleep(0.1)
        for task in slow:
            task.cancel()
        await asyncio.gather(*slow, return_exceptions=True)
        with pytest.raises(TimeoutError):
            await client.request(server.address, "/call", {"n": 0, "delay": 0.5}, timeout=0.05)
        # every slot is free again: these complete instead of waiting forever
        done = await asyncio.wait_for(
            asyncio.gather(*(client.request(server.address, "/call", {"n": i}) for i in range(10))),
            10,
        )
        await client.aclose()
        return done

    assert asyncio.run(main()) == list(range(10))


@pytest.mark.parametrize("pipelining", [False, True])
def test_a_refused_connection_is_a_worker_unreachable_error_naming_the_address(pipelining):
    """Both ways of connecting (the pooled connection and the pipelined one) report a
    refused connect the same way."""
    import socket

    from corral.rpc.client import WorkerUnreachableError

    with socket.socket() as probe:  # a port with nobody listening on it
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"
    client = AsyncRPCClient(SECRET, pipelining=pipelining)

    async def call():
        return await client.request(address, "/echo", {"n": 1}, timeout=5)

    try:
        with pytest.raises(WorkerUnreachableError) as err:
            asyncio.run(call())
        assert address in str(err.value)
    finally:
        client.close()
