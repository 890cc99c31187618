"""A real WorkerRuntime served in-process: authentication first, exactly-once requests,
broken connections, keep-alive, and refusal of malformed fork/engine requests."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
import uuid
import zlib

import psutil
import pytest

from corral.auth import AUTH_HEADER, sign_request_head
from corral.errors import (
    AuthenticationError,
    EngineCallError,
    EngineImportError,
    ProtocolError,
    SchedulerError,
)
from corral.rpc import wire
from corral.rpc.client import RPCClient
from corral.rpc.http import REQUEST_ID_HEADER, SocketReader
from corral.worker.env import WorkerSettings
from corral.worker.runtime import WorkerRuntime

SECRET = "a" * 64
ECHO = "corral.testing.engines.EchoEngine"
ENDPOINTS = [
    ("GET", "/health"),
    ("POST", "/create_engine"),
    ("POST", "/call"),
    ("POST", "/set_env"),
    ("POST", "/configure"),
    ("POST", "/destroy_engines"),
    ("POST", "/fork"),
    ("POST", "/kill_forked_worker"),
    ("POST", "/shutdown"),
]


@pytest.fixture(scope="module")
def runtime(tmp_path_factory):
    root = tmp_path_factory.mktemp("rpc")
    settings = WorkerSettings(
        experiment="rpctest",
        trial="t0",
        role="host",
        index=0,
        name_resolve={"type": "nfs", "root": str(root / "nr")},
        log_dir=str(root / "logs"),
        port_count=1,
        lease_timeout=5.0,
        controller_pid=None,
        controller_host=None,
        die_with_parent=False,
        bind_host="127.0.0.1",
        backend_id=None,
        forked=False,
        engines={"main": ECHO},
    )
    rt = WorkerRuntime(settings, SECRET)
    rt.start()
    rt.test_address = f"127.0.0.1:{rt.server.port}"
    yield rt
    rt.stop()


@pytest.fixture
def client():
    c = RPCClient(SECRET)
    yield c
    c.close()


@pytest.fixture
def sigterm_guard():
    """/shutdown SIGTERMs its own process: record instead of dying, and prove none came."""
    got: list[int] = []
    old = signal.signal(signal.SIGTERM, lambda signum, _frame: got.append(signum))
    yield got
    time.sleep(0.2)  # a shutdown thread would fire after 0.05 s
    signal.signal(signal.SIGTERM, old)


def raw_request(
    address: str,
    method: str,
    path: str,
    body: bytes = b"",
    secret: str | None = None,
    content_length: int | None = None,
    request_id: str | None = None,
    timeout: float = 5.0,
):
    """Send one request by hand; return (reply message, socket)."""
    host, _, port = address.rpartition(":")
    sock = socket.create_connection((host, int(port)), timeout=timeout)
    lines = [f"{method} {path} HTTP/1.1", "Host: corral"]
    length = len(body) if content_length is None else content_length
    if secret:
        auth = sign_request_head(
            secret, method, path, body, length=length, request_id=request_id or ""
        )
        lines.append(f"{AUTH_HEADER}: {auth}")
    elif secret is not None:
        lines.append(f"x-corral-secret: {secret}")  # the old bearer header: refused too
    if request_id is not None:
        lines.append(f"{REQUEST_ID_HEADER}: {request_id}")
    lines.append(f"Content-Length: {len(body) if content_length is None else content_length}")
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
    reader = SocketReader(sock)
    msg = reader.read_head()
    assert msg is not None, "the server closed without a reply"
    msg.body = reader.read_body(msg.content_length)
    return msg, sock


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


# ---------------------------------------------------------------- authentication

HOSTILE_PAYLOADS = {
    "/create_engine": {"engine": ECHO, "engine_name": "intruder"},
    "/call": {"engine_name": "main", "method": "echo", "args": [1]},
    "/set_env": {"env": {"CORRAL_TEST_INTRUDER": "1"}},
    "/configure": {"config": {"owned": True}, "role": "x", "rank": 9},
    "/destroy_engines": {},
    "/fork": {"role": "intruder", "index": 0},
    "/kill_forked_worker": {"worker_id": "intruder/0"},
    "/shutdown": {},
}


@pytest.mark.parametrize("method,path", ENDPOINTS)
@pytest.mark.parametrize("secret", [None, "", "wrong", SECRET[:-1], SECRET + "x", SECRET.upper()])
def test_unauthenticated_request_is_refused_before_the_body(
    runtime, sigterm_guard, method, path, secret
) -> None:
    before_children = _children()
    calls_before = runtime.engines.engines["main"].calls
    payload = HOSTILE_PAYLOADS.get(path)
    body = wire.encode_bytes(payload) if payload is not None else b""
    # Announce a 1 GiB body but send only the real payload: a server that tried to read the
    # body would hang here; the 401 must come back at once.
    msg, sock = raw_request(
        runtime.test_address, method, path, body, secret=secret, content_length=1 << 30
    )
    with sock:
        assert msg.status == 401
        assert msg.headers.get("connection") == "close"
        assert b"secret" in bytes(msg.body)
        sock.settimeout(5)
        try:
            assert sock.recv(1) == b"", "connection must be closed after a 401"
        except ConnectionResetError:
            pass
    assert "intruder" not in runtime.engines.engines
    assert set(runtime.engines.engines) >= {"main"}
    assert runtime.engines.engines["main"].calls == calls_before
    assert "CORRAL_TEST_INTRUDER" not in os.environ
    assert runtime.config.get("role") != "x"
    assert "intruder/0" not in runtime.forks.children
    assert _children() - before_children == set()
    assert sigterm_guard == []


def test_client_with_wrong_secret_gets_authentication_error(runtime) -> None:
    bad = RPCClient("not-the-secret")
    try:
        with pytest.raises(AuthenticationError, match="401"):
            bad.request(runtime.test_address, "/call", {"method": "echo", "args": [1]})
        with pytest.raises(AuthenticationError):
            bad.request(runtime.test_address, "/health", method="GET")
    finally:
        bad.close()


def test_right_secret_is_served(runtime, client) -> None:
    health = client.request(runtime.test_address, "/health", method="GET")
    assert health["status"] == "ok" and health["worker_id"] == "host/0"
    assert "main" in health["engines"]


# ---------------------------------------------------------------- exactly once


def _engine(runtime, client, name: str) -> str:
    client.request(runtime.test_address, "/create_engine", {"engine": ECHO, "engine_name": name})
    return name


def test_same_request_id_runs_the_method_once(runtime, client) -> None:
    name = _engine(runtime, client, "once")
    rid = uuid.uuid4().hex
    payload = {"engine_name": name, "method": "echo", "args": [[1, 2, 3]]}
    first = client.request(runtime.test_address, "/call", payload, request_id=rid)
    second = client.request(runtime.test_address, "/call", payload, request_id=rid)
    assert first == second == [1, 2, 3]
    count = client.request(runtime.test_address, "/call", {"engine_name": name, "method": "count"})
    assert count == 1
    client.request(runtime.test_address, "/call", payload)  # a new id runs again
    assert (
        client.request(runtime.test_address, "/call", {"engine_name": name, "method": "count"}) == 2
    )


def test_retried_failure_is_answered_from_cache(runtime, client) -> None:
    rid = uuid.uuid4().hex
    payload = {"engine_name": "main", "method": "fail", "args": ["first"]}
    for _ in range(2):
        with pytest.raises(EngineCallError, match="first"):
            client.request(runtime.test_address, "/call", payload, request_id=rid)


def test_concurrent_duplicates_wait_for_the_first(runtime) -> None:
    name = "concurrent"
    c0 = RPCClient(SECRET)
    _engine(runtime, c0, name)
    rid = uuid.uuid4().hex
    payload = {"engine_name": name, "method": "sleep", "args": [0.4]}
    results: list = []
    errors: list = []

    def call() -> None:
        c = RPCClient(SECRET)
        try:
            results.append(c.request(runtime.test_address, "/call", payload, request_id=rid))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            c.close()

    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert errors == []
    assert results == [0.4] * 4
    assert c0.request(runtime.test_address, "/call", {"engine_name": name, "method": "count"}) == 1
    c0.close()


# ---------------------------------------------------------------- broken connections


def test_connection_cut_mid_body_leaves_server_healthy(runtime, client) -> None:
    host, _, port = runtime.test_address.rpartition(":")
    total = 64 * 1024 * 1024
    for _ in range(2):
        sock = socket.create_connection((host, int(port)), timeout=5)
        rid = f"cut-{uuid.uuid4().hex}"
        auth = sign_request_head(SECRET, "POST", "/call", length=total, request_id=rid)
        sock.sendall(
            f"POST /call HTTP/1.1\r\n{AUTH_HEADER}: {auth}\r\n"
            f"{REQUEST_ID_HEADER}: {rid}\r\nContent-Length: {total}\r\n\r\n".encode()
        )
        chunk = b"\0" * (1 << 20)
        for _ in range(total // 2 // len(chunk)):
            sock.sendall(chunk)
        sock.close()
    deadline = time.monotonic() + 5
    while runtime.server._conns and time.monotonic() < deadline:
        time.sleep(0.02)
    fresh = RPCClient(SECRET)
    try:
        assert fresh.request(runtime.test_address, "/health", method="GET")["status"] == "ok"
        value = fresh.request(
            runtime.test_address, "/call", {"engine_name": "main", "method": "echo", "args": [7]}
        )
        assert value == 7
    finally:
        fresh.close()


def test_client_that_closes_before_reading_reply(runtime, client) -> None:
    msg, sock = raw_request(
        runtime.test_address,
        "POST",
        "/call",
        wire.encode_bytes({"engine_name": "main", "method": "noop"}),
        secret=SECRET,
    )
    sock.close()
    assert msg.status == 200
    assert client.request(runtime.test_address, "/health", method="GET")["status"] == "ok"


def test_keep_alive_connection_is_reused(runtime) -> None:
    c = RPCClient(SECRET)
    try:
        addr = runtime.test_address
        c.request(addr, "/health", method="GET")
        pool = c._idle[addr]
        assert len(pool) == 1
        local = pool[0].sock.getsockname()
        for i in range(20):
            assert (
                c.request(addr, "/call", {"engine_name": "main", "method": "echo", "args": [i]})
                == i
            )
        assert len(c._idle[addr]) == 1
        assert c._idle[addr][0].sock.getsockname() == local, "a new connection was opened"
        server_side = [
            conn
            for conn in psutil.Process().net_connections(kind="tcp")
            if conn.laddr
            and conn.laddr.port == runtime.server.port
            and conn.raddr
            and conn.raddr.port == local[1]
        ]
        assert len(server_side) == 1
    finally:
        c.close()


def test_body_that_is_not_a_frame_gets_400(runtime) -> None:
    msg, sock = raw_request(
        runtime.test_address, "POST", "/call", b"not a frame at all", secret=SECRET
    )
    sock.close()
    assert msg.status == 400
    envelope = wire.decode(msg.body)
    assert envelope["ok"] is False and envelope["error"]["type"] == "ProtocolError"


def test_body_that_is_not_a_mapping_is_refused(runtime, client) -> None:
    with pytest.raises(ProtocolError, match="mapping"):
        client.request(runtime.test_address, "/call", [1, 2, 3])


def test_unknown_endpoint_gets_404(runtime, client) -> None:
    with pytest.raises(ProtocolError, match="404"):
        client.request(runtime.test_address, "/../../etc/passwd", {})
    with pytest.raises(ProtocolError, match="404"):
        client.request(runtime.test_address, "/fork", method="GET")


# ---------------------------------------------------------------- malformed fork / engine


@pytest.mark.parametrize(
    "role",
    ["../../etc", "/etc/passwd", "a/b", "..", "x:y", "with space", "", "x" * 65, "-rf"],
)
def test_fork_with_bad_role_is_refused(runtime, client, role) -> None:
    before, forked = _children(), set(runtime.forks.children)
    with pytest.raises(SchedulerError) as info:
        client.request(runtime.test_address, "/fork", {"role": role, "index": 0, "timeout": 2})
    assert "fork.role" in str(info.value)
    assert "'/'" in str(info.value)
    assert set(runtime.forks.children) == forked
    assert _children() - before == set()


@pytest.mark.parametrize(
    "module",
    [
        "os; rm -rf /",
        "-c",
        "-m",
        "--help",
        "corral.worker -c print(1)",
        "../corral/worker",
        "corral..worker",
        "corral/worker.py",
        "1module",
        "$(touch /tmp/pwned)",
        "corral.worker\n",
    ],
)
def test_fork_with_module_that_is_not_a_dotted_name_is_refused(runtime, client, module) -> None:
    before = _children()
    role = f"child{zlib.crc32(module.encode())}"
    with pytest.raises(SchedulerError) as info:
        client.request(
            runtime.test_address,
            "/fork",
            {"role": role, "index": 0, "module": module, "timeout": 2},
        )
    assert "fork.command" in str(info.value)
    assert "Python module" in str(info.value)
    assert f"{role}/0" not in runtime.forks.children
    time.sleep(0.05)
    assert _children() - before == set()


@pytest.mark.parametrize(
    "path",
    [
        "",
        "os.system; rm -rf /",
        "os.system('id')",
        "../evil.Engine",
        "/tmp/evil.py",
        "corral..testing.EchoEngine",
        "corral.testing.engines:",
        ":EchoEngine",
        "corral.testing.engines::EchoEngine",
        "-c",
        "corral.testing.engines.EchoEngine\n",
        " corral.testing.engines.EchoEngine",
    ],
)
def test_create_engine_with_malformed_import_path_is_refused(runtime, client, path) -> None:
    with pytest.raises(EngineImportError) as info:
        client.request(
            runtime.test_address, "/create_engine", {"engine": path, "engine_name": "malformed"}
        )
    assert "is not of the form" in str(info.value)
    assert "malformed" not in runtime.engines.engines


def test_create_engine_with_unknown_module_names_it(runtime, client) -> None:
    with pytest.raises(EngineImportError, match="corral_no_such_module"):
        client.request(
            runtime.test_address,
            "/create_engine",
            {"engine": "corral_no_such_module.Engine", "engine_name": "missing"},
        )
    assert "missing" not in runtime.engines.engines


@pytest.mark.parametrize("method", ["_private", "__class__", "__init__", "__reduce__", "tag", 5])
def test_call_of_private_or_non_callable_method_is_refused(runtime, client, method) -> None:
    with pytest.raises(EngineCallError) as info:
        client.request(runtime.test_address, "/call", {"engine_name": "main", "method": method})
    assert repr(method) in str(info.value)


def test_set_env_with_non_mapping_is_refused(runtime, client) -> None:
    with pytest.raises(ProtocolError, match="mapping"):
        client.request(runtime.test_address, "/set_env", {"env": ["A=1"]})


def test_kill_of_unknown_forked_worker_is_false(runtime, client) -> None:
    assert (
        client.request(runtime.test_address, "/kill_forked_worker", {"worker_id": "x/0"}) is False
    )


# ---------------------------------------------------------------- malformed arrays


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_array_that_does_not_fit_its_buffer_gets_a_400_and_the_server_keeps_serving(
    runtime, client, kind
) -> None:
    """A /call frame whose tensor claims more elements than its buffer holds is answered
    with a clean 400 naming the mismatch (not a dropped connection), and nothing runs."""
    import numpy as np
    import torch

    from tests.unit.test_wire import _frame_with_shape

    calls_before = runtime.engines.engines["main"].calls
    arg = np.ones(4, np.float32) if kind == "numpy" else torch.ones(4)
    body = _frame_with_shape({"engine_name": "main", "method": "echo", "args": [arg]}, [5])
    msg, sock = raw_request(runtime.test_address, "POST", "/call", body, secret=SECRET)
    sock.close()
    assert msg.status == 400
    reply = wire.decode(bytes(msg.body))
    assert reply["error"]["type"] == "ProtocolError"
    assert "does not fit" in reply["error"]["message"]
    assert runtime.engines.engines["main"].calls == calls_before
    assert client.request(runtime.test_address, "/health", method="GET")["status"] == "ok"


# ---------------------------------------------------------------- pooled connections


def test_a_pooled_connection_the_worker_dropped_is_redialled_not_failed(runtime) -> None:
    """The worker (here: the network) drops an idle pooled connection; the next request
    goes out on a fresh connection and succeeds, with no error to the caller."""
    from tests.support.proxy import CuttingProxy

    host, _, port = runtime.test_address.rpartition(":")
    proxy = CuttingProxy((host, int(port)), cut_after=0, cuts=0)
    client = RPCClient(SECRET)
    try:
        address = f"127.0.0.1:{proxy.port}"
        assert client.request(address, "/health", method="GET")["status"] == "ok"
        proxy.reset()
        assert client.request(address, "/health", method="GET")["status"] == "ok"
        assert proxy.connections == 2
    finally:
        client.close()
        proxy.close()


def test_a_connection_the_worker_closes_after_refusing_is_not_pooled(runtime) -> None:
    """A refusal (401) comes with ``Connection: close``: the client must not keep that
    connection for the next request."""
    bad = RPCClient("not-the-secret")
    try:
        with pytest.raises(AuthenticationError):
            bad.request(runtime.test_address, "/health", method="GET")
        assert bad._idle.get(runtime.test_address, []) == []
    finally:
        bad.close()
