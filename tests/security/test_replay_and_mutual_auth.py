"""Attack 3: the secret was a bearer token in clear text and a captured request replayed
byte for byte ran again. Now nothing secret crosses the wire, every request is signed
(method, path, request id, target, body digest, nonce, timestamp), replays and stale
timestamps are refused, and a peer without the secret cannot answer (mutual auth)."""

from __future__ import annotations

import asyncio
import re
import socket
import time

import pytest

from corral import Job
from corral.auth import AUTH_HEADER, TrialKeys, sign_request_head
from corral.errors import AuthenticationError
from corral.rpc.client import AsyncRPCClient, RPCClient
from corral.rpc.http import SocketReader
from tests.security.support import Listener, RecordingProxy

ECHO = "corral.testing.engines.EchoEngine"


def _send_raw(address: tuple[str, int], data: bytes):
    with socket.create_connection(address, timeout=10) as sock:
        sock.sendall(data)
        reader = SocketReader(sock)
        msg = reader.read_head()
        msg.body = reader.read_body(msg.content_length)
        return msg


def _first_request(stream: bytes) -> bytes:
    head_end = stream.index(b"\r\n\r\n") + 4
    length = int(re.search(rb"Content-Length: (\d+)", stream[:head_end]).group(1))
    return stream[: head_end + length]


@pytest.fixture
def recorded(sched):
    """A worker with an engine, called once by the controller through a recording proxy."""
    (wid,) = sched.create_workers(Job(role="rep", replicas=1))
    asyncio.run(sched.create_engine(wid, ECHO, "e"))
    worker = sched.get_workers("rep")[0]
    target = (worker.ip, worker.port)
    proxy = RecordingProxy(target)
    client = RPCClient(sched.secret)
    try:
        address = f"127.0.0.1:{proxy.port}"
        payload = {"engine_name": "e", "method": "echo", "args": ["once"]}
        assert client.request(address, "/call", payload, identity=worker.identity) == "once"
        yield sched, wid, target, proxy
    finally:
        client.close()
        proxy.close()


def test_secret_and_keys_never_cross_the_wire(recorded) -> None:
    sched, _wid, _target, proxy = recorded
    keys = TrialKeys(sched.secret)
    wire = bytes(proxy.to_worker) + bytes(proxy.to_client)
    assert b"x-corral-auth" in wire  # the recording did capture signed traffic
    for needle in (sched.secret.encode(), keys.request.hex().encode(), keys.reply.hex().encode(),
                   keys.body.hex().encode(), keys.record.hex().encode(), keys.request):  # fmt: skip
        assert needle not in wire


def test_captured_request_replayed_byte_for_byte_is_refused(recorded) -> None:
    sched, wid, target, proxy = recorded
    captured = _first_request(bytes(proxy.to_worker))
    reply = _send_raw(target, captured)
    assert reply.status == 401 and b"replayed" in bytes(reply.body)
    assert sched.call_engine(wid, "count", "e") == 1  # ran once, not twice


def test_captured_request_with_a_new_request_id_is_refused(recorded) -> None:
    sched, wid, target, proxy = recorded
    captured = _first_request(bytes(proxy.to_worker))
    forged = re.sub(rb"x-corral-request-id: \w+", b"x-corral-request-id: " + b"f" * 32, captured)
    assert forged != captured
    reply = _send_raw(target, forged)
    assert reply.status == 401 and b"wrong signature" in bytes(reply.body)
    assert sched.call_engine(wid, "count", "e") == 1


def test_request_with_an_altered_body_is_refused(recorded) -> None:
    sched, wid, target, proxy = recorded
    captured = _first_request(bytes(proxy.to_worker))
    altered = captured.replace(b"once", b"twce")
    assert altered != captured
    reply = _send_raw(target, altered)
    assert reply.status == 401
    assert sched.call_engine(wid, "count", "e") == 1


@pytest.mark.parametrize("offset", [-3600, 3600], ids=["an-hour-old", "an-hour-ahead"])
def test_timestamp_too_far_from_the_workers_clock_is_refused(recorded, monkeypatch, offset) -> None:
    """A request stamped too far from the worker's clock is refused, in the past (a
    replay) and in the future (a request made now to be replayed later)."""
    sched, wid, target, _proxy = recorded
    client = RPCClient(sched.secret)
    real = time.time
    monkeypatch.setattr("corral.auth.time.time", lambda: real() + offset)
    try:
        with pytest.raises(AuthenticationError, match="401"):
            client.request(f"{target[0]}:{target[1]}", "/call",
                           {"engine_name": "e", "method": "echo", "args": [1]})  # fmt: skip
        auth = sign_request_head(sched.secret, "GET", "/health")  # the same, by hand
    finally:
        monkeypatch.undo()
        client.close()
    assert sched.call_engine(wid, "count", "e") == 1  # the refused call never ran
    head = f"GET /health HTTP/1.1\r\n{AUTH_HEADER}: {auth}\r\nContent-Length: 0\r\n\r\n"
    reply = _send_raw(target, head.encode())
    assert reply.status == 401 and b"off this host's clock" in bytes(reply.body), reply.body


def test_impostor_without_the_secret_cannot_answer() -> None:
    """Mutual authentication: a listener that answers 200 (as a hijacked address would)
    is refused by both clients, and what it received holds nothing secret."""
    secret = "c" * 64
    listener = Listener()
    sync_client, async_client = RPCClient(secret), AsyncRPCClient(secret)
    try:
        with pytest.raises(AuthenticationError, match="did not prove"):
            sync_client.request(listener.address, "/set_env", {"env": {"A": "1"}})
        with pytest.raises(AuthenticationError, match="did not prove"):
            asyncio.run(async_client.request(listener.address, "/call", {"method": "x"}))
        assert listener.connections >= 2
        assert secret.encode() not in listener.received
        assert TrialKeys(secret).request.hex().encode() not in listener.received
    finally:
        sync_client.close()
        listener.close()
