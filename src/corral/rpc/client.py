"""Clients for the worker RPC: a blocking one and an asyncio one, sharing the codec.

Connections are kept alive and reused per address. Every call carries a request id, so a
call retried after a dropped connection is answered from the worker's result cache instead
of running the method twice.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import os
import socket
import threading
from typing import Any

from corral import errors
from corral.auth import AUTH_HEADER, RequestSigner, TrialKeys
from corral.errors import AuthenticationError, ProtocolError
from corral.rpc import shm, wire
from corral.rpc.http import (
    FRAME_TYPE,
    IDENTITY_HEADER,
    LARGE_BODY,
    REQUEST_ID_HEADER,
    Message,
    SocketReader,
    parse_head,
    send_message,
    tune_socket,
)
from corral.rpc.peers import SharedMemoryPeers, _SegmentParts
from corral.rpc.pipeline import PIPELINE_LINE, Pipe, ack

CONNECT_TIMEOUT = 5.0
MAX_REPLY = 8 * 1024**3
#: Connections the async client keeps open to one worker (per event loop); more calls wait.
MAX_CONNECTIONS_PER_ADDRESS = 8
SMALL_BODY = 64 * 1024
_REMOTE_ERRORS = {
    name: getattr(errors, name)
    for name in (
        "EngineImportError", "EngineCreationError", "EngineCallError",
        "WorkerNotFoundError", "ConfigError", "ProtocolError", "WorkerCreationError",
        "RefError", "RefLostError",
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


class _RequestIds:
    """Request ids: a random per-process prefix and a counter (unique without uuid4's
    cost per call); a forked child picks a new prefix."""

    def __init__(self) -> None:
        self.reset()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self.reset)

    def reset(self) -> None:
        self.prefix = os.urandom(8).hex()
        self.counter = itertools.count(1)

    def next(self) -> str:
        return f"{self.prefix}{next(self.counter):08x}"


_ids = _RequestIds()


def new_request_id() -> str:
    """An id no other request of any process will carry (the worker caches by it)."""
    return _ids.next()


_STATIC_HEAD = f"Host: corral\r\nContent-Type: {FRAME_TYPE}\r\n"


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
    if cls is errors.RefLostError:
        raise errors.RefLostError(message, str(error.get("owner", "")))
    if cls is not None:
        raise cls(message + (f"\n--- remote traceback ---\n{tb}" if tb else ""))
    raise errors.EngineCallError(f"{kind}: {message}", remote_traceback=tb)


def interpret_reply(address: str, msg: Message) -> Any:
    if msg.status == 409:
        text = bytes(msg.body[:300]).decode("utf-8", "replace")
        raise WorkerUnreachableError(address, ConnectionRefusedError(text))
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


def _request_headers(request_id: str, identity: str | None = None) -> dict[str, str]:
    headers = {"Host": "corral", REQUEST_ID_HEADER: request_id, "Content-Type": FRAME_TYPE}
    if identity:
        headers[IDENTITY_HEADER] = identity
    return headers


def sign_headers(
    signer: RequestSigner, headers: dict[str, str], method: str, path: str, request_id: str,
    identity: str | None, parts: list, length: int,
) -> str:  # fmt: skip
    """Add the signature (after the shared-memory headers are set); the reply's nonce."""
    auth, nonce = signer.sign(
        method, path, request_id, identity or "", parts, length, shm.signed_headers(headers),
    )  # fmt: skip
    headers[AUTH_HEADER] = auth
    return nonce


def check_reply_head(
    signer: RequestSigner, address: str, msg: Message, nonce: str, max_reply: int
) -> str:
    """Refuse a reply head before its body is read: a 401, a head not signed by the
    trial's worker, or a body over ``max_reply``. Returns the body digest to check."""
    if msg.status == 401:
        raise AuthenticationError(
            f"worker at {address} refused the request (401): the trial secret is missing or "
            "wrong; connect with the scheduler that started the worker"
        )
    length = msg.content_length
    digest = signer.verify_reply_head(
        address,
        msg.headers.get(AUTH_HEADER),
        msg.status,
        nonce,
        msg.headers.get("content-type", ""),
        length,
        shm.signed_headers(msg.headers),
    )
    if length > max_reply:
        raise ProtocolError(
            f"worker at {address} announced a reply of {length} bytes, over the client's limit "
            f"of {max_reply}; raise max_reply if such replies are expected"
        )
    return digest


def check_reply_body(signer: RequestSigner, address: str, digest: str, body) -> None:
    if not signer.keys.body_matches(digest, body):
        raise AuthenticationError(
            f"the reply body from {address} does not match its signed digest: it was altered "
            "on the way"
        )


class _Conn:
    offered = False  # has this connection carried the shared-memory offer yet?

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

    def __init__(self, secret: str, max_reply: int = MAX_REPLY):
        self._signer = RequestSigner(TrialKeys(secret))
        self.max_reply = max_reply
        self._idle: dict[str, list[_Conn]] = {}
        self._lock = threading.Lock()
        self.shm = SharedMemoryPeers()
        self.bytes_received = 0  # reply bytes, by socket or shared memory (benchmarks)

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
        Large bodies to and from a worker on this host go through shared memory.
        """
        request_id = request_id or new_request_id()
        parts = wire.encode(payload) if method == "POST" else []
        headers = _request_headers(request_id, identity)
        retried = False
        while True:
            try:
                conn, reused = self._take(address)
            except TimeoutError:
                raise
            except OSError as exc:
                raise WorkerUnreachableError(address, exc) from None
            send = self.shm.prepare(address, headers, parts, not conn.offered)
            conn.offered = True
            length = wire.frame_size(send) if send else 0
            nonce = sign_headers(
                self._signer, headers, method, path, request_id, identity, send, length
            )
            try:
                conn.sock.settimeout(timeout)
                send_message(conn.sock, f"{method} {path} HTTP/1.1", headers, send)
                reply = conn.reader.read_head()
                if reply is None:
                    raise ConnectionResetError("worker closed the connection")
                digest = check_reply_head(self._signer, address, reply, nonce, self.max_reply)
                body = self.shm.receive(address, reply)
                if body is None:
                    reply.body = conn.reader.read_body(reply.content_length)
                    check_reply_body(self._signer, address, digest, reply.body)
                    self.bytes_received += reply.content_length
                else:
                    reply.body = body
                    self.bytes_received += body.nbytes
                if shm.SEGMENT_HEADER in reply.headers:
                    conn.sock.sendall(shm.ACK if body is not None else shm.NAK)
            except TimeoutError:
                conn.close()
                raise TimeoutError(f"no reply from {address}{path} within {timeout}s") from None
            except OSError as exc:
                conn.close()
                if reused and not retried:
                    retried = True
                    continue
                raise WorkerUnreachableError(address, exc) from None
            except (AuthenticationError, ProtocolError):
                conn.close()
                raise
            if reply.keep_alive:
                self._give_back(address, conn)
            else:
                conn.close()
            if self.shm.refused(address, reply, body):
                continue
            return interpret_reply(address, reply)


class _LoopPool:
    """Connections to one address used from one event loop: the idle ones, how many are
    open, and the calls waiting for one. At most ``limit`` connections are open at once;
    a call beyond that waits for the next connection to come back."""

    __slots__ = ("idle", "open", "waiters", "limit", "pipe", "pipe_opening")

    def __init__(self, limit: int):
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self.open = 0
        self.waiters: collections.deque[asyncio.Future] = collections.deque()
        self.limit = limit
        self.pipe: Pipe | None = None  # the pipelined connection (small /call requests)
        self.pipe_opening: asyncio.Task | None = None

    def pipe_opened(self, task: asyncio.Task) -> None:
        if self.pipe_opening is task:
            self.pipe_opening = None
        if not task.cancelled() and task.exception() is None:
            self.pipe = task.result()

    def close_pipe(self, dead_loop: bool = False) -> None:
        pipe, self.pipe = self.pipe, None
        if pipe is None:
            return
        if dead_loop:
            sock = getattr(pipe.transport, "_sock", None)  # selector transports (CPython)
            if sock is not None:
                try:
                    sock.close()
                except OSError:
                    pass
        else:
            pipe.close()

    async def acquire(self, opener) -> tuple[Any, bool]:
        """(connection, reused). Opens a new one while under the limit, else waits."""
        while True:
            if self.idle:
                return self.idle.pop(), True
            if self.open < self.limit:
                self.open += 1
                try:
                    return await opener(), False
                except BaseException:
                    self.open -= 1
                    self._wake()
                    raise
            waiter = asyncio.get_running_loop().create_future()
            self.waiters.append(waiter)
            try:
                conn = await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled() and waiter.result() is not None:
                    self.release(waiter.result())
                else:
                    self._remove(waiter)
                raise
            if conn is not None:
                return conn, True
            # None: a connection was closed, so there is room to open one

    def release(self, conn) -> None:
        """Give a healthy connection back: straight to the oldest waiter, or to the idle list."""
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        self.idle.append(conn)

    def discard(self, writer: asyncio.StreamWriter) -> None:
        """A connection that broke or was closed: free its slot for a waiter."""
        writer.close()
        self.open -= 1
        self._wake()

    def _wake(self) -> None:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _remove(self, waiter: asyncio.Future) -> None:
        try:
            self.waiters.remove(waiter)
        except ValueError:
            pass


class AsyncRPCClient:
    """asyncio client with the same wire and semantics as RPCClient.

    At most ``max_connections`` connections per worker address and event loop: a fan-out
    of thousands of calls reuses a few connections (and the worker a few threads) instead
    of opening one per call in flight.
    """

    def __init__(
        self,
        secret: str,
        max_connections: int = MAX_CONNECTIONS_PER_ADDRESS,
        max_reply: int = MAX_REPLY,
        pipelining: bool = True,
    ):
        """``pipelining``: small requests (up to ``SMALL_BODY``) share one pipelined
        connection per worker (``corral.rpc.pipeline``); a larger one takes a connection of
        its own from the pool."""
        if max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, not {max_connections}")
        self.pipelining = pipelining
        self._signer = RequestSigner(TrialKeys(secret))
        self.max_reply = max_reply
        self.shm = SharedMemoryPeers()
        self.bytes_received = 0
        self.max_connections = max_connections
        self._pools: dict[asyncio.AbstractEventLoop, dict[str, _LoopPool]] = {}
        self._cache: tuple[Any, dict[str, _LoopPool]] = (None, {})
        self._lock = threading.Lock()

    def _loop_pools(self) -> dict[str, _LoopPool]:
        """The running loop's pools. Several loops (threads) may share this client; pools of
        loops that were closed (each ``asyncio.run`` makes a new loop) are dropped so their
        sockets are freed."""
        loop = asyncio.get_running_loop()
        cached = self._cache  # one read: another thread may replace it meanwhile
        if cached[0] is loop:
            return cached[1]
        self.prune()
        with self._lock:
            by_address = self._pools.setdefault(loop, {})
            self._cache = (loop, by_address)
        return by_address

    def _pool(self, address: str) -> _LoopPool:
        by_address = self._loop_pools()
        pool = by_address.get(address)
        if pool is None:
            pool = by_address[address] = _LoopPool(self.max_connections)
        return pool

    def connections(self) -> int:
        """Open connections, all loops and addresses together."""
        with self._lock:
            return sum(
                p.open + (p.pipe is not None and p.pipe.closed is None)
                for pools in self._pools.values()
                for p in pools.values()
            )

    def forget(self, address: str) -> None:
        """Close the running loop's idle connections to ``address`` (a worker that is gone
        or done with). Call it from a coroutine on that loop."""
        by_address = self._loop_pools()
        pool = by_address.get(address)
        if pool is not None:
            idle, pool.idle = pool.idle, []
            for _reader, writer in idle:
                pool.discard(writer)
            if pool.pipe is not None and not pool.pipe.pending:
                pool.close_pipe()
            if pool.open == 0 and not pool.waiters and pool.pipe is None:
                del by_address[address]

    def prune(self) -> None:
        """Close the idle connections of event loops that were closed (each ``asyncio.run``
        makes a new loop) and drop their pools."""
        with self._lock:
            closed = [lp for lp in self._pools if lp.is_closed()]
            dropped = [self._pools.pop(lp) for lp in closed]
            if self._cache[0] is not None and self._cache[0].is_closed():
                self._cache = (None, {})
        for by_address in dropped:
            for pool in by_address.values():
                for _reader, writer in pool.idle:
                    _close_dead_transport(writer)
                pool.idle = []
                pool.close_pipe(dead_loop=True)

    def forget_all(self) -> None:
        """Close every idle connection of the running loop (a batch of requests is done)."""
        for address in list(self._loop_pools()):
            self.forget(address)

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
        parts = wire.encode(payload)
        request_id = request_id or new_request_id()
        if timeout is None:
            if self.pipelining and wire.frame_size(parts) <= SMALL_BODY:
                pool = self._pool(address)  # one coroutine less on the fan-out path
                return await self._send_pipelined(pool, address, path, parts, request_id, identity)
            return await self._send(address, path, parts, request_id, identity)
        try:
            async with asyncio.timeout(timeout):
                return await self._send(address, path, parts, request_id, identity)
        except TimeoutError:
            raise TimeoutError(f"no reply from {address}{path} within {timeout}s") from None

    def _head(
        self, path: str, request_id: str, identity: str | None, length: int, extra: dict,
        pipelined: bool = False,
    ) -> bytes:  # fmt: skip
        who = f"{IDENTITY_HEADER}: {identity}\r\n" if identity else ""
        more = "".join(f"{k}: {v}\r\n" for k, v in extra.items())
        if pipelined:
            more += PIPELINE_LINE
        return (
            f"POST {path} HTTP/1.1\r\n{_STATIC_HEAD}{REQUEST_ID_HEADER}: {request_id}\r\n"
            f"{who}{more}Content-Length: {length}\r\n\r\n"
        ).encode("latin-1")

    def _frame(
        self, address: str, path: str, parts: list, request_id: str, identity, writer
    ) -> tuple[list, str]:
        """Head and body parts for one attempt on this connection (shared memory decided
        here: the offer rides on a connection's first request), signed; and the nonce."""
        extra: dict[str, str] = {}
        send = self.shm.prepare(address, extra, parts, not getattr(writer, "_offered", False))
        writer._offered = True
        length = wire.frame_size(send)
        nonce = sign_headers(self._signer, extra, "POST", path, request_id, identity, send, length)
        head = self._head(path, request_id, identity, length, extra)
        if isinstance(send, _SegmentParts):
            send.append(head)  # the list keeps the segment alive until the reply is in
            return send, nonce
        if length <= SMALL_BODY:
            return [head + b"".join(send)], nonce
        return [head, *send], nonce

    async def _send(
        self, address: str, path: str, parts: list, request_id: str, identity: str | None
    ) -> Any:
        pool = self._pool(address)
        if self.pipelining and wire.frame_size(parts) <= SMALL_BODY:
            return await self._send_pipelined(pool, address, path, parts, request_id, identity)
        return await self._send_exclusive(pool, address, path, parts, request_id, identity)

    async def _send_exclusive(
        self, pool: _LoopPool, address: str, path: str, parts: list, request_id: str,
        identity: str | None,
    ) -> Any:  # fmt: skip
        """One call on a connection of its own (taken from the pool, given back after)."""
        retried = False
        while True:
            try:
                conn, reused = await pool.acquire(lambda: self._open(address))
            except TimeoutError:
                raise TimeoutError(
                    f"could not connect to {address} within {CONNECT_TIMEOUT}s"
                ) from None
            except OSError as exc:
                raise WorkerUnreachableError(address, exc) from None
            reader, writer = conn
            frame, nonce = self._frame(address, path, parts, request_id, identity, writer)
            try:
                reply, body = await self._exchange(address, reader, writer, frame, nonce)
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
                pool.discard(writer)
                if reused and not retried:
                    retried = True
                    continue
                raise WorkerUnreachableError(address, exc) from None
            except BaseException:  # cancelled or timed out mid-exchange: the stream is unusable
                pool.discard(writer)
                raise
            if reply.keep_alive:
                pool.release(conn)
            else:
                pool.discard(writer)
            if self.shm.refused(address, reply, body):
                continue
            return interpret_reply(address, reply)

    async def _send_pipelined(
        self, pool: _LoopPool, address: str, path: str, parts: list, request_id: str,
        identity: str | None,
    ) -> Any:  # fmt: skip
        """One call over the worker's pipelined connection (opened on first use; a call
        whose connection breaks is sent once more, with the same id, on a new one)."""
        retried = False
        while True:
            pipe = pool.pipe
            if pipe is None or pipe.closed is not None:
                pipe = await self._open_pipe(pool, address)
            if request_id in pipe.pending:  # the same id twice at once: not on one pipe
                return await self._send_exclusive(pool, address, path, parts, request_id, identity)
            extra: dict[str, str] = {}
            send = self.shm.prepare(address, extra, parts, not pipe.offered)
            pipe.offered = True
            length = wire.frame_size(send)
            nonce = sign_headers(
                self._signer, extra, "POST", path, request_id, identity, send, length
            )
            head = self._head(path, request_id, identity, length, extra, pipelined=True)
            future = pipe.expect(request_id, nonce)
            pipe.send(head + b"".join(send) if send else head)
            try:
                msg = await future
            except OSError as exc:
                if not retried:
                    retried = True
                    continue
                raise WorkerUnreachableError(address, exc) from None
            except BaseException:  # cancelled or timed out: its reply is dropped on arrival
                pipe.forget(request_id)
                raise
            body = self.shm.receive(address, msg)
            if shm.SEGMENT_HEADER in msg.headers:
                pipe.send(ack(b"ACK" if body is not None else b"NAK", request_id))
                msg.body = body if body is not None else bytearray()
                self.bytes_received += body.nbytes if body is not None else 0
            else:
                if len(msg.body) >= SMALL_BODY:  # proof of delivery for a large reply
                    pipe.send(ack(b"ACK", request_id))
                self.bytes_received += len(msg.body)
            if self.shm.refused(address, msg, body):
                continue
            return interpret_reply(address, msg)

    async def _open_pipe(self, pool: _LoopPool, address: str) -> Pipe:
        """The pipelined connection, opened once however many calls wait for it."""
        opening = pool.pipe_opening
        if opening is None:
            opening = pool.pipe_opening = asyncio.ensure_future(self._connect_pipe(address))
            opening.add_done_callback(pool.pipe_opened)
        try:
            return await asyncio.shield(opening)
        except TimeoutError:
            raise TimeoutError(
                f"could not connect to {address} within {CONNECT_TIMEOUT}s"
            ) from None
        except OSError as exc:
            raise WorkerUnreachableError(address, exc) from None

    async def _connect_pipe(self, address: str) -> Pipe:
        host, port = split_address(address)
        loop = asyncio.get_running_loop()
        signer, limit = self._signer, self.max_reply

        def protocol() -> Pipe:
            return Pipe(
                loop,
                lambda msg, nonce: check_reply_head(signer, address, msg, nonce, limit),
                lambda digest, body: check_reply_body(signer, address, digest, body),
                limit,
            )

        transport, pipe = await asyncio.wait_for(
            loop.create_connection(protocol, host, port), CONNECT_TIMEOUT
        )
        sock = transport.get_extra_info("socket")
        if sock is not None:
            tune_socket(sock)
        return pipe

    async def _exchange(self, address: str, reader, writer, parts: list, nonce: str):
        if len(parts) == 1:
            writer.write(parts[0])
        else:
            writer.writelines(parts)
        await writer.drain()
        raw = await reader.readuntil(b"\r\n\r\n")
        msg = parse_head(raw[:-4])
        digest = check_reply_head(self._signer, address, msg, nonce, self.max_reply)
        body = self.shm.receive(address, msg)
        if shm.SEGMENT_HEADER in msg.headers:
            writer.write(shm.ACK if body is not None else shm.NAK)
            msg.body = body if body is not None else bytearray()
            self.bytes_received += body.nbytes if body is not None else 0
            return msg, body
        length = msg.content_length
        if length <= SMALL_BODY:
            msg.body = bytearray(await reader.readexactly(length)) if length else bytearray()
        else:
            msg.body = await _read_exactly_into(reader, length)
        check_reply_body(self._signer, address, digest, msg.body)
        self.bytes_received += length
        return msg, body

    def close(self) -> None:
        """Close every idle connection, from any thread: loops that are still open close
        theirs on their own thread, those of closed loops are closed here."""
        with self._lock:
            pools, self._pools = self._pools, {}
            self._cache = (None, {})
        for loop, by_address in pools.items():
            writers = [w for pool in by_address.values() for _r, w in pool.idle]
            for pool in by_address.values():
                pool.idle = []
                if pool.pipe is not None:
                    if loop.is_closed():
                        pool.close_pipe(dead_loop=True)
                    else:
                        try:
                            loop.call_soon_threadsafe(pool.close_pipe)
                        except RuntimeError:
                            pool.close_pipe(dead_loop=True)
            for writer in writers:
                if loop.is_closed():
                    _close_dead_transport(writer)
                    continue
                try:
                    loop.call_soon_threadsafe(writer.close)
                except RuntimeError:  # the loop closed meanwhile
                    _close_dead_transport(writer)

    async def aclose(self) -> None:
        """Close the idle connections of every loop (call it on the last loop in use)."""
        with self._lock:
            pools, self._pools = self._pools, {}
            self._cache = (None, {})
        for by_address in pools.values():
            for pool in by_address.values():
                for _reader, writer in pool.idle:
                    writer.close()
                pool.idle = []
                pool.close_pipe()


def _close_dead_transport(writer: asyncio.StreamWriter) -> None:
    """Close the socket of a transport whose loop is closed (``writer.close()`` would need
    the loop). Without this the socket waits for the garbage collector's cycle pass."""
    sock = getattr(writer.transport, "_sock", None)  # selector transports (CPython)
    if sock is not None:
        try:
            sock.close()
        except OSError:
            pass


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
