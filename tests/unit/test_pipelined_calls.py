"""Pipelined calls (corral.rpc.pipeline, issue 15 third pass) on a real in-process worker.

Small ``/call`` requests of the async client share one connection per worker and do not
wait for each other; replies come back as they are ready and are matched by request id.
What must hold: each call gets its own reply (a reply labelled with another request's id
is refused by its signature), a slow call does not hold up the calls behind it, a call
given up leaves the connection usable, and on such a connection only an explicit ACK
proves that a reply was delivered (the next request proves nothing).

No timings here: benchmarks/ measures the speed.
"""

from __future__ import annotations

import asyncio
import socket
import time
import uuid

import pytest

from corral.auth import AUTH_HEADER, sign_request_head
from corral.errors import AuthenticationError
from corral.rpc import wire
from corral.rpc.client import AsyncRPCClient
from corral.rpc.http import PIPELINE_HEADER, REQUEST_ID_HEADER, SocketReader
from corral.rpc.pipeline import ack
from corral.rpc.server import RPCServer
from tests.unit.test_rpc_server import SECRET, runtime  # noqa: F401  (module fixture)

MiB = 1 << 20
ECHO = "corral.testing.engines.EchoEngine"


def _call(method: str, *args, engine: str = "main") -> dict:
    return {"engine_name": engine, "method": method, "args": list(args), "kwargs": {}}


def _rid() -> str:
    return uuid.uuid4().hex


def test_concurrent_small_calls_share_one_connection_and_each_gets_its_own_reply(runtime):  # noqa: F811
    client = AsyncRPCClient(SECRET)
    before = len(runtime.server._conns)

    async def go():
        return await asyncio.gather(
            *(
                client.request(runtime.test_address, "/call", _call("echo", i), timeout=30)
                for i in range(200)
            )
        )

    assert asyncio.run(go()) == list(range(200))
    assert len(runtime.server._conns) - before <= 1  # one connection carried all 200
    client.close()


def test_a_slow_coroutine_call_does_not_hold_up_the_calls_behind_it(runtime):  # noqa: F811
    client = AsyncRPCClient(SECRET)
    done: list[str] = []

    async def one(payload, label):
        result = await client.request(runtime.test_address, "/call", payload, timeout=60)
        done.append(label)
        return result

    async def go():
        slow = asyncio.ensure_future(one(_call("async_echo", "slow", 3.0), "slow"))
        await asyncio.sleep(0.2)  # the slow call is on the connection first
        fast = await asyncio.gather(*(one(_call("echo", i), f"fast{i}") for i in range(5)))
        opened = client.connections()
        return fast, opened, await slow

    fast, opened, slow = asyncio.run(go())
    assert fast == list(range(5)) and slow == "slow"
    assert opened == 1  # all six on one connection
    assert done[-1] == "slow", done  # the fast calls were answered while it ran
    client.close()


def test_a_reply_labelled_with_another_requests_id_is_refused(runtime, monkeypatch):  # noqa: F811
    a, b = _rid(), _rid()
    swap = {a: b, b: a}
    original = RPCServer.write_reply

    def mislabel(self, *args, request_id=None, **kwargs):
        return original(self, *args, request_id=swap.get(request_id, request_id), **kwargs)

    monkeypatch.setattr(RPCServer, "write_reply", mislabel)
    client = AsyncRPCClient(SECRET)

    async def go():
        return await asyncio.gather(
            client.request(runtime.test_address, "/call", _call("echo", "A"), request_id=a, timeout=5),
            client.request(runtime.test_address, "/call", _call("echo", "B"), request_id=b, timeout=5),
            return_exceptions=True,
        )  # fmt: skip

    results = asyncio.run(go())
    assert "A" not in results and "B" not in results, results  # never the other's reply
    assert any(isinstance(r, AuthenticationError) for r in results), results
    client.close()


def test_a_call_given_up_leaves_the_pipelined_connection_usable(runtime):  # noqa: F811
    client = AsyncRPCClient(SECRET)

    async def go():
        with pytest.raises(TimeoutError):
            await client.request(
                runtime.test_address, "/call", _call("async_echo", "late", 1.0), timeout=0.1
            )
        pipe = client._pool(runtime.test_address).pipe
        await asyncio.sleep(1.5)  # its reply arrives now, for nobody
        result = await client.request(runtime.test_address, "/call", _call("echo", 7), timeout=30)
        return pipe, client._pool(runtime.test_address).pipe, result

    before, after, result = asyncio.run(go())
    assert result == 7
    assert before is after and after.closed is None
    client.close()


def test_delivery_of_a_large_socket_reply_is_proven_by_an_ack_naming_it(runtime):  # noqa: F811
    client = AsyncRPCClient(SECRET)
    client.shm.token = ""  # in-process: no shared memory, the reply comes over the socket
    rid = _rid()

    async def go():
        return await client.request(
            runtime.test_address, "/call", _call("blob", 2 * MiB), request_id=rid, timeout=60
        )

    assert len(asyncio.run(go())) == 2 * MiB
    client.close()
    for _ in range(200):  # the ACK is read by the connection's thread
        if rid in runtime.cache._delivered:
            break
        time.sleep(0.05)
    assert rid in runtime.cache._delivered


def _pipelined_request(payload: dict, request_id: str) -> bytes:
    body = wire.encode_bytes(payload)
    auth = sign_request_head(SECRET, "POST", "/call", body, request_id=request_id)
    head = (
        f"POST /call HTTP/1.1\r\nHost: t\r\nContent-Type: application/x-corral-frame\r\n"
        f"{REQUEST_ID_HEADER}: {request_id}\r\n{PIPELINE_HEADER}: 1\r\n{AUTH_HEADER}: {auth}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def test_on_a_pipelined_connection_the_next_request_does_not_prove_delivery(runtime):  # noqa: F811
    host, port = runtime.test_address.rsplit(":", 1)
    first, second = _rid(), _rid()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        reader = SocketReader(sock)
        sock.sendall(_pipelined_request(_call("blob", 2 * MiB), first))
        head = reader.read_head()  # the reply is made (and cached); its body is not read yet
        assert head is not None and head.headers[REQUEST_ID_HEADER] == first
        # the next request goes out before the first reply is read whole (pipelined)
        sock.sendall(_pipelined_request(_call("echo", 1), second))
        assert len(reader.read_body(head.content_length)) > 2 * MiB
        head = reader.read_head()
        assert head is not None and head.headers[REQUEST_ID_HEADER] == second
        reader.read_body(head.content_length)
        assert first not in runtime.cache._delivered  # a later request is no proof here
        sock.sendall(ack(b"ACK", first))
        sock.sendall(_pipelined_request(_call("echo", 2), _rid()))
        reader.read_head()  # the ACK was read before this request
    assert first in runtime.cache._delivered


def test_an_ack_for_a_request_this_connection_never_carried_proves_nothing(runtime):  # noqa: F811
    """A delivery proof counts only on the connection that carried the (signed) request:
    an ACK naming another connection's request id, or sent before any signed request,
    leaves that reply in the worker's cache."""
    host, port = runtime.test_address.rsplit(":", 1)
    rid = _rid()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        reader = SocketReader(sock)
        sock.sendall(_pipelined_request(_call("blob", 2 * MiB), rid))
        head = reader.read_head()
        reader.read_body(head.content_length)
        with socket.create_connection((host, int(port)), timeout=30) as other:
            other.sendall(ack(b"ACK", rid))  # unauthenticated, another connection
            other_reader = SocketReader(other)
            other.sendall(_pipelined_request(_call("echo", 1), _rid()))
            other_reader.read_head()  # the ACK was read before this request
        assert rid not in runtime.cache._delivered
        sock.sendall(ack(b"ACK", rid) + _pipelined_request(_call("echo", 2), _rid()))
        reader.read_head()
    assert rid in runtime.cache._delivered
