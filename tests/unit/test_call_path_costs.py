"""The per-call savings of issue 15 (second pass) keep the behaviour they replace.

* ``TrialKeys.sign`` copies a pre-keyed HMAC: the signature is still HMAC-SHA256 of the
  fields, and an altered request is still refused.
* ``ResultCache`` makes no Event per request: a duplicate that arrives while the first runs
  still waits for it and gets its reply.
* ``SocketReader.set_timeout`` skips the system call when the timeout is unchanged, and the
  server reads a body that arrives after its head (the body-timeout path) as before.

No timings here: benchmarks/ measures the speed.
"""

from __future__ import annotations

import hashlib
import hmac
import socket
import threading
import time
import uuid

import pytest

from corral.auth import AUTH_HEADER, RequestSigner, RequestVerifier, TrialKeys
from corral.rpc import wire
from corral.rpc.http import REQUEST_ID_HEADER, SocketReader
from corral.rpc.server import Reply
from corral.worker.result_cache import ResultCache
from tests.unit.test_rpc_server import SECRET, runtime  # noqa: F401  (module fixture)


# ---------------------------------------------------------------- signing
@pytest.mark.parametrize("which", ["request", "reply", "record", "body"])
def test_sign_is_hmac_sha256_of_the_fields_under_each_key(which: str) -> None:
    keys = TrialKeys(SECRET)
    key = getattr(keys, which)  # "body" has no pre-keyed copy: the plain path
    fields = ["corral-request", "v1", "POST", "/call", "id-1", "w/0", "12", "n-1", "1.0", "d"]
    want = hmac.new(key, "\n".join(fields).encode(), hashlib.sha256).hexdigest()
    assert keys.sign(key, fields) == want
    assert keys.sign(key, fields) == want  # the keyed template is copied, not consumed
    assert keys.sign(key, [*fields[:-1], "e"]) != want


def test_an_altered_signed_head_is_refused() -> None:
    keys = TrialKeys(SECRET)
    signer, verifier = RequestSigner(keys), RequestVerifier(keys)
    body = [b"payload"]
    header, _nonce = signer.sign("POST", "/call", "rid", "w/0", body, 7)
    args = ("POST", "/call", "rid", "w/0", 7)
    for i, altered in enumerate(["/shutdown", "other", "w/1"]):
        bad = list(args)
        bad[i + 1] = altered
        why, _, _ = verifier.verify_head(header, *bad)
        assert why is not None and "wrong signature" in why, (i, why)
    why, nonce, digest = verifier.verify_head(header, *args)
    assert why is None and nonce
    assert keys.body_matches(digest, b"payload")
    assert not keys.body_matches(digest, b"payloae")
    why, _, _ = verifier.verify_head(header, *args)  # the same head again: a replay
    assert why is not None and "replayed" in why
    other = RequestVerifier(TrialKeys(SECRET + "x"))
    header2, _ = signer.sign("POST", "/call", "rid", "w/0", body, 7)
    assert "wrong signature" in other.verify_head(header2, *args)[0]


def test_remembered_body_matches_only_the_same_bytes_under_the_same_digest() -> None:
    keys = TrialKeys(SECRET)
    body = wire.encode_bytes({"ok": True, "result": None})
    digest = keys.body_digest([body], len(body))
    other = body[:-1] + b"0"
    assert keys.body_matches(digest, body)
    assert keys.body_matches(digest, bytearray(body))  # remembered: the same bytes again
    assert keys.body_matches(digest, memoryview(body))
    assert not keys.body_matches(digest, other)  # another body under the remembered digest
    assert not keys.body_matches(keys.body_digest([other], len(other)), body)
    assert not keys.body_matches("sha256=" + "0" * 64, body)
    assert keys.body_matches(keys.body_digest([other], len(other)), other)
    assert not keys.body_matches(digest, other)


def test_reply_signature_of_a_remembered_body_is_the_signature_of_that_body() -> None:
    keys = TrialKeys(SECRET)
    verifier, signer = RequestVerifier(keys), RequestSigner(keys)
    first, second = b"CRL1 one body", b"CRL1 two body"
    for body in (first, first, second, first):
        head = verifier.sign_reply(200, "n-1", "t", [body])
        digest = signer.verify_reply_head("a:1", head, 200, "n-1", "t", len(body))
        assert digest == keys.body_digest([body], len(body))
        assert keys.body_matches(digest, body)


# ---------------------------------------------------------------- result cache
def test_result_cache_makes_no_event_unless_a_duplicate_waits() -> None:
    cache = ResultCache()
    assert cache.begin("a") is None
    assert cache._running == {"a": None}
    reply = Reply(200, wire.encode({"ok": True, "result": 1}))
    cache.finish("a", reply)
    assert cache._running == {}
    assert cache.begin("a") is reply


def test_result_cache_duplicate_waits_for_the_first_and_gets_its_reply() -> None:
    cache = ResultCache()
    assert cache.begin("b") is None
    got: list = []
    waiter = threading.Thread(target=lambda: got.append(cache.begin("b")))
    waiter.start()
    for _ in range(500):  # until the duplicate is parked on its Event
        if cache._running.get("b") is not None:
            break
        time.sleep(0.01)
    assert isinstance(cache._running["b"], threading.Event)
    assert got == []
    reply = Reply(200, wire.encode({"ok": True, "result": 2}))
    cache.finish("b", reply)
    waiter.join(10)
    assert got == [reply]


# ---------------------------------------------------------------- socket timeouts
class _CountingSocket(socket.socket):
    settimeout_calls = 0

    def settimeout(self, value):  # noqa: D102
        type(self).settimeout_calls += 1
        super().settimeout(value)


def test_read_head_sets_an_unchanged_timeout_only_once() -> None:
    a, b = socket.socketpair()
    counted = _CountingSocket(fileno=a.detach())
    try:
        reader = SocketReader(counted)
        for i in range(5):
            b.sendall(f"POST /x{i} HTTP/1.1\r\nContent-Length: 0\r\n\r\n".encode())
            msg = reader.read_head(30.0, 10.0)
            assert msg is not None and msg.path == f"/x{i}"
            assert counted.gettimeout() == 30.0
        assert _CountingSocket.settimeout_calls == 1
        reader.set_timeout(5.0)
        assert counted.gettimeout() == 5.0 and _CountingSocket.settimeout_calls == 2
    finally:
        counted.close()
        b.close()


def test_a_body_sent_after_its_head_is_read_and_answered(runtime) -> None:  # noqa: F811
    """The server skips the body timeout when the body came with the head; one that comes
    later still gets read (and checked against its signed digest)."""
    keys = TrialKeys(SECRET)
    signer = RequestSigner(keys)
    host, _, port = runtime.test_address.rpartition(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    try:
        reader = SocketReader(sock)
        for i, value in enumerate([1, "x" * 200_000]):
            body = b"".join(bytes(p) for p in wire.encode({"engine_name": "main",
                                                            "method": "echo",
                                                            "args": [value]}))  # fmt: skip
            rid = uuid.uuid4().hex
            auth, _ = signer.sign("POST", "/call", rid, "", [body], len(body))
            head = (
                f"POST /call HTTP/1.1\r\n{AUTH_HEADER}: {auth}\r\n{REQUEST_ID_HEADER}: {rid}\r\n"
                f"Content-Length: {len(body)}\r\n\r\n"
            ).encode()
            sock.sendall(head)
            time.sleep(0.05)  # the head alone first, so the server waits for the body
            sock.sendall(body)
            msg = reader.read_head()
            assert msg is not None and msg.status == 200, (i, msg)
            reply = wire.decode(reader.read_body(msg.content_length))
            assert reply == {"ok": True, "result": value}
    finally:
        sock.close()


# ---------------------------------------------------------------- kernel timeouts (server)
@pytest.fixture
def quick_server():
    """An RPCServer whose connections time out fast (the worker's defaults are 10 s/300 s)."""
    from corral.rpc.server import RPCServer

    server = RPCServer(
        SECRET, lambda msg: Reply(200, [b"hi"], "text/plain"), head_timeout=0.3,
        idle_timeout=0.6,
    ).start()  # fmt: skip
    yield server
    server.stop()


def _closed_by_server(sock: socket.socket) -> bool:
    """True once the server has closed ``sock`` (within this socket's own 10 s timeout)."""
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


@pytest.mark.parametrize("sent", [b"", b"POST /x HTTP/1.1\r\nContent-Le"])
def test_server_drops_a_connection_that_sends_no_complete_head(quick_server, sent) -> None:
    """Nothing, or half a head: the kernel's receive timeout ends the wait."""
    sock = socket.create_connection(("127.0.0.1", quick_server.port), timeout=10)
    try:
        sock.sendall(sent)
        assert _closed_by_server(sock)
    finally:
        sock.close()


def test_server_drops_a_connection_idle_after_a_request_and_serves_before(quick_server) -> None:
    signer = RequestSigner(TrialKeys(SECRET))
    sock = socket.create_connection(("127.0.0.1", quick_server.port), timeout=10)
    try:
        reader = SocketReader(sock)
        for _ in range(3):
            auth, _ = signer.sign("POST", "/x", "", "", [b""], 0)
            sock.sendall(f"POST /x HTTP/1.1\r\n{AUTH_HEADER}: {auth}\r\n\r\n".encode())
            msg = reader.read_head()
            assert msg is not None and msg.status == 200
            assert bytes(reader.read_body(msg.content_length)) == b"hi"
        assert _closed_by_server(sock)  # then idle: closed after idle_timeout
    finally:
        sock.close()


# ---------------------------------------------------------------- engine methods
def test_coroutine_method_check_is_remembered_per_function_and_stays_right() -> None:
    import functools

    from corral.worker import engines

    class Engine:
        def sync(self) -> int:
            return 1

        async def coro(self) -> int:
            return 2

    a, b = Engine(), Engine()
    for _ in range(2):  # the second round answers from the cache
        assert engines.is_coroutine_method(a.sync) is False
        assert engines.is_coroutine_method(b.coro) is True
        assert engines.is_coroutine_method(a.coro) is True
    assert Engine.sync in engines._COROUTINE_FUNCTIONS
    assert engines.is_coroutine_method(functools.partial(a.sync)) is False  # not cached
    assert engines.is_coroutine_method(lambda: None) is False
