"""Clients for the worker RPC: a blocking one and an asyncio one, sharing the codec.

Connections are kept alive and reused per address. Every call carries a request id, so a
call retried after a dropped connection is answered from the worker's result cache instead
of running the method twice.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import uuid
from typing import Any

from corral import errors
from corral.errors import AuthenticationError, ProtocolError
from corral.rpc import wire
from corral.rpc.http import (
    FRAME_TYPE,
    IDENTITY_HEADER,
    LARGE_BODY,
    REQUEST_ID_HEADER,
    SECRET_HEADER,
    Message,
    SocketReader,
    parse_head,
    render_head,
    send_message,
    tune_socket,
)

CONNECT_TIMEOUT = 5.0
_REMOTE_ERRORS = {
    name: getattr(errors, name)
    for name in (
        "EngineImportError", "EngineCreationError", "EngineCallError",
        "WorkerNotFoundError", "ConfigError", "ProtocolError", "WorkerCreationError",
    )
}  # fmt: skip


class WorkerUnreachableError(ConnectionError):
    """The connection to a worker failed or broke; the worker may have died."""

    def __init__(self, address: str, cause: BaseException):
        self.address = address
        self.cause = cause
        super().__init__(f"worker at {address} is unreachable: {type(cause).__name__}: {cause}")


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def new_request_id() -> str:
    return uuid.uuid4().hex


def raise_remote(error: dict) -> None:
    """Turn an error envelope from a worker back into the matching corral exception."""
    kind = error.get("type", "")
    message = error.get("message", "remote error")
    tb = error.get("traceback", "")
    cls = _REMOTE_ERRORS.get(kind)
    if cls is errors.EngineCallError:
        raise errors.EngineCallError(message, remote_traceback=tb)
    if cls is errors.ConfigError:
        raise errors.SchedulerError(message)
    if cls is not None:
        raise cls(message + (f"\n--- remote traceback ---\n{tb}" if tb else ""))
    raise errors.EngineCallError(f"{kind}: {message}", remote_traceback=tb)


def interpret_reply(address: str, msg: Message) -> Any:
    if msg.status == 409:
        text = bytes(msg.body[:300]).decode("utf-8", "replace")
        raise WorkerUnreachableError(address, ConnectionRefusedError(text))
    if msg.status == 401:
        raise AuthenticationError(
            f"worker at {address} refused the request (401): the trial secret is missing or "
            "wrong; connect with the scheduler that started the worker"
        )
    if msg.headers.get("content-type") != FRAME_TYPE:
        text = bytes(msg.body[:500]).decode("utf-8", "replace")
        if msg.status == 200:
            return json.loads(text) if text else None
        raise ProtocolError(f"worker at {address} answered {msg.status}: {text}")
    envelope = wire.decode(msg.body)
    if not isinstance(envelope, dict) or "ok" not in envelope:
        raise ProtocolError(f"worker at {address} sent a reply without an envelope")
    if not envelope["ok"]:
        raise_remote(envelope.get("error") or {})
    return envelope.get("result")


def _request_headers(secret: str, request_id: str, identity: str | None = None) -> dict[str, str]:
    headers = {
        "Host": "corral",
        SECRET_HEADER: secret,
        REQUEST_ID_HEADER: request_id,
        "Content-Type": FRAME_TYPE,
    }
    if identity:
        headers[IDENTITY_HEADER] = identity
    return headers


class _Conn:
    def __init__(self, address: str):
        host, port = split_address(address)
        self.sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT)
        tune_socket(self.sock)
        self.reader = SocketReader(self.sock)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class RPCClient:
    """Blocking client. Thread-safe: each thread takes its own pooled connection."""

    def __init__(self, secret: str):
        self.secret = secret
        self._idle: dict[str, list[_Conn]] = {}
        self._lock = threading.Lock()

    def _take(self, address: str) -> tuple[_Conn, bool]:
        with self._lock:
            pool = self._idle.get(address)
            if pool:
                return pool.pop(), True
        return _Conn(address), False

    def _give_back(self, address: str, conn: _Conn) -> None:
        with self._lock:
            self._idle.setdefault(address, []).append(conn)

    def forget(self, address: str) -> None:
        """Close pooled connections to ``address`` (a worker that is gone)."""
        with self._lock:
            for conn in self._idle.pop(address, []):
                conn.close()

    def close(self) -> None:
        with self._lock:
            pools, self._idle = self._idle, {}
        for pool in pools.values():
            for conn in pool:
                conn.close()

    def request(
        self,
        address: str,
        path: str,
        payload: Any = None,
        *,
        method: str = "POST",
        timeout: float | None = None,
        request_id: str | None = None,
        identity: str | None = None,
    ) -> Any:
        """Send one request; return the decoded result or raise the remote error.

        ``identity`` (``worker_id#generation``) makes a worker refuse a request meant for
        an earlier or other worker at the same address.

        Raises TimeoutError at ``timeout`` and WorkerUnreachableError if the connection
        cannot be made or breaks (a reused connection is retried once on a fresh one).
        """
        request_id = request_id or new_request_id()
        parts = wire.encode(payload) if method == "POST" else []
        headers = _request_headers(self.secret, request_id, identity)
        for attempt in range(2):
            try:
                conn, reused = self._take(address)
            except TimeoutError:
                raise
            except OSError as exc:
                raise WorkerUnreachableError(address, exc) from None
            try:
                conn.sock.settimeout(timeout)
                send_message(conn.sock, f"{method} {path} HTTP/1.1", headers, parts)
                reply = conn.reader.read_head()
                if reply is None:
                    raise ConnectionResetError("worker closed the connection")
                reply.body = conn.reader.read_body(reply.content_length)
            except TimeoutError:
                conn.close()
                raise TimeoutError(f"no reply from {address}{path} within {timeout}s") from None
            except OSError as exc:
                conn.close()
                if reused and attempt == 0:
                    continue
                raise WorkerUnreachableError(address, exc) from None
            if reply.keep_alive:
                self._give_back(address, conn)
            else:
                conn.close()
            return interpret_reply(address, reply)
        raise AssertionError("unreachable")


class AsyncRPCClient:
    """asyncio client with the same wire and semantics as RPCClient."""

    def __init__(self, secret: str):
        self.secret = secret
        self._pools: dict[
            asyncio.AbstractEventLoop,
            dict[str, list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]],
        ] = {}

    def _pool(self, address: str) -> list:
        """Idle connections of the running loop. Connections of loops that were closed
        (each ``asyncio.run`` makes a new loop) are dropped so their sockets are freed."""
        loop = asyncio.get_running_loop()
        for old in [lp for lp in self._pools if lp.is_closed()]:
            del self._pools[old]  # their transports close their sockets when collected
        return self._pools.setdefault(loop, {}).setdefault(address, [])

    async def _open(self, address: str):
        host, port = split_address(address)
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, limit=1 << 20), CONNECT_TIMEOUT
        )
        sock = writer.get_extra_info("socket")
        if sock is not None:
            tune_socket(sock)
        return reader, writer

    async def request(
        self,
        address: str,
        path: str,
        payload: Any = None,
        *,
        timeout: float | None = None,
        request_id: str | None = None,
        identity: str | None = None,
    ) -> Any:
        request_id = request_id or new_request_id()
        parts = wire.encode(payload)
        length = wire.frame_size(parts)
        head = render_head(
            f"POST {path} HTTP/1.1", _request_headers(self.secret, request_id, identity), length
        )
        for attempt in range(2):
            pool = self._pool(address)
            reused = bool(pool)
            try:
                reader, writer = pool.pop() if pool else await self._open(address)
            except TimeoutError:
                raise TimeoutError(
                    f"could not connect to {address} within {CONNECT_TIMEOUT}s"
                ) from None
            except OSError as exc:
                raise WorkerUnreachableError(address, exc) from None
            try:
                reply = await asyncio.wait_for(self._exchange(reader, writer, head, parts), timeout)
            except TimeoutError:
                writer.close()
                raise TimeoutError(f"no reply from {address}{path} within {timeout}s") from None
            except (OSError, asyncio.IncompleteReadError) as exc:
                writer.close()
                if reused and attempt == 0:
                    continue
                raise WorkerUnreachableError(address, exc) from None
            if reply.keep_alive:
                pool.append((reader, writer))
            else:
                writer.close()
            return interpret_reply(address, reply)
        raise AssertionError("unreachable")

    @staticmethod
    async def _exchange(reader, writer, head: bytes, parts: list) -> Message:
        writer.write(head)
        writer.writelines(parts)
        await writer.drain()
        raw = await reader.readuntil(b"\r\n\r\n")
        msg = parse_head(raw[:-4])
        msg.body = await _read_exactly_into(reader, msg.content_length)
        return msg

    async def aclose(self) -> None:
        pools, self._pools = self._pools, {}
        for by_address in pools.values():
            for _reader, writer in (c for conns in by_address.values() for c in conns):
                writer.close()


async def _read_exactly_into(reader: asyncio.StreamReader, length: int) -> memoryview:
    """Read a body chunk by chunk into one buffer, so the stream's own buffer stays small."""
    if length >= LARGE_BODY:
        import numpy as np

        view = memoryview(np.empty(length, dtype=np.uint8))
    else:
        view = memoryview(bytearray(length))
    have = 0
    while have < length:
        chunk = await reader.read(min(length - have, 1 << 20))
        if not chunk:
            raise asyncio.IncompleteReadError(bytes(view[:have]), length)
        view[have : have + len(chunk)] = chunk
        have += len(chunk)
    return view
