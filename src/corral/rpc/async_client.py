"""The asyncio RPC client: the same wire and semantics as the blocking ``RPCClient``.

Small requests to a worker share one pipelined connection (``rpc.pipeline``); larger ones
take a connection of their own from a bounded pool (``rpc.pool``).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable
from functools import partial
from typing import Any

from corral.auth import RequestSigner, TrialKeys
from corral.rpc import frames, plain, shm, wire
from corral.rpc.http import IDENTITY_HEADER, REQUEST_ID_HEADER, parse_head, tune_socket
from corral.rpc.peers import SharedMemoryPeers, _SegmentParts
from corral.rpc.pipeline import PIPELINE_LINE, TEXT_PIPELINE_LINE, Pipe, ack
from corral.rpc.pool import _LoopPool, close_dead_transport, connect_errors, read_exactly_into
from corral.rpc.protocol import (
    _STATIC_HEAD,
    CONNECT_TIMEOUT,
    MAX_CONNECTIONS_PER_ADDRESS,
    MAX_REPLY,
    SMALL_BODY,
    WorkerUnreachableError,
    check_reply_body,
    check_reply_head,
    interpret_reply,
    new_request_id,
    reply_value,
    sign_headers,
    split_address,
)

#: ``send_small``'s result when the call must be sent again (shared memory failed)
RESEND = object()


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
        frames: bool = True,
    ):
        """``pipelining``: small requests (up to ``SMALL_BODY``) share one pipelined
        connection per worker (``corral.rpc.pipeline``); a larger one takes a connection of
        its own from the pool. ``frames``: offer the binary frame on pipelined connections
        (``corral.rpc.frames``); without, every request and reply has a text head."""
        if max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, not {max_connections}")
        self.pipelining = pipelining
        self._pipeline_line = PIPELINE_LINE if frames else TEXT_PIPELINE_LINE
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
                    close_dead_transport(writer)
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

    async def request(self, address: str, path: str, payload: Any = None, **options: Any) -> Any:
        """Send one request; its decoded result, or the remote error raised (``start``'s options)."""
        return await self.start(address, path, payload, **options)

    def send_small(
        self, address: str, path: str, payload: Any, request_id: str, identity: str | None,
        future: asyncio.Future | None = None, body: bytes | None = None, pipe: Pipe | None = None,
    ) -> asyncio.Future | None:  # fmt: skip
        """A small call sent at once as a frame on the address's framed pipelined
        connection; the future of its result (``future``, or a new one): the decoded
        result, the remote error, an OSError if the connection broke, or ``RESEND`` (shared
        memory failed: send it again with ``start``). None: no such connection now, or a
        body too large for a frame: use ``start``. No coroutine of its own (a fan-out's
        garbage, docs/benchmarks.md). ``body``, ``pipe``: the frame, ``framed_pipe``, if known."""
        pipe = pipe if pipe is not None else self.framed_pipe(address)
        if pipe is None or request_id in pipe.pending:
            return None
        if body is None:  # ``payload``'s frame, unless the caller made it
            body = plain.encode_plain(payload) if type(payload) is dict else None
            body = body or b"".join(wire.encode(payload))
        if len(body) >= frames.MAX_BODY or not frames.head_fits(path, request_id, identity):
            return None
        data, nonce = frames.request_frame(self._signer, path, request_id, identity or "", body)
        future = pipe.expect(request_id, nonce, True, future)
        pipe.send(data)
        return future

    def framed_pipe(self, address: str) -> Pipe | None:
        """The running loop's framed connection to ``address`` a frame can take now, or None."""
        pool = self._loop_pools().get(address)
        pipe = pool.pipe if pool is not None else None
        if pipe is None or not pipe.framed or pipe.closed is not None:
            return None
        if shm.has_released(self.shm.local.get(address)):  # they ride on a text head
            return None
        return pipe

    def forget_call(self, loop: asyncio.AbstractEventLoop, address: str, request_id: str) -> None:
        """A ``send_small`` call on ``loop`` given up (cancelled): its reply is dropped."""
        pool = self._pools.get(loop, {}).get(address)
        if pool is not None and pool.pipe is not None:
            pool.pipe.forget(request_id)

    def _received_frame(self, address: str, status: int, content_type: str, body) -> Any:
        """A reply frame's result (a frame carries no shared-memory header, no large body)."""
        self.bytes_received += len(body)
        return reply_value(address, status, content_type, body)

    def _received(self, address: str, pipe: Pipe, request_id: str, msg) -> Any:
        """A pipelined reply's result: its body taken from a segment (ACK/NAK sent) or the
        socket (a large one ACKed), then interpreted; ``RESEND`` if shared memory failed."""
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
            return RESEND
        return interpret_reply(address, msg)

    def start(
        self,
        address: str,
        path: str,
        payload: Any = None,
        *,
        timeout: float | None = None,
        request_id: str | None = None,
        identity: str | None = None,
    ) -> Awaitable[Any]:
        """``request`` for a caller that awaits at once (``Caller.acall``): the payload is
        encoded here (a bad one raises here) and the awaitable is the coroutine that sends
        it: one coroutine layer less per call on the fan-out path, whose coroutines are
        most of what a call keeps alive in flight (docs/benchmarks.md, issue 29)."""
        parts = wire.encode(payload)
        request_id = request_id or new_request_id()
        if timeout is None:
            if self.pipelining and wire.frame_size(parts) <= SMALL_BODY:
                pool = self._pool(address)
                return self._send_pipelined(pool, address, path, parts, request_id, identity)
            return self._send(address, path, parts, request_id, identity)
        return self._send_within(address, path, parts, request_id, identity, timeout)

    async def _send_within(
        self, address: str, path: str, parts: list, request_id: str, identity: str | None,
        timeout: float,
    ) -> Any:  # fmt: skip
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
            more += self._pipeline_line
        return (
            f"POST {path} HTTP/1.1\r\n{_STATIC_HEAD}{REQUEST_ID_HEADER}: {request_id}\r\n"
            f"{who}{more}Content-Length: {length}\r\n\r\n"
        ).encode("latin-1")

    def _frame(
        self, address: str, path: str, parts: list, request_id: str, identity, fresh: bool
    ) -> tuple[list, str]:
        """Head and body parts for one attempt on this connection (shared memory decided
        here: the offer rides on a ``fresh`` connection's first request: a pooled one
        has carried a request before), signed; and the nonce."""
        extra: dict[str, str] = {}
        send = self.shm.prepare(address, extra, parts, fresh)
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
            with connect_errors(address):
                conn, reused = await pool.acquire(lambda: self._open(address))
            reader, writer = conn
            frame, nonce = self._frame(address, path, parts, request_id, identity, not reused)
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
            if (
                pipe.framed
                and not extra
                and length < frames.MAX_BODY
                and frames.head_fits(path, request_id, identity)
            ):  # one MAC (rpc.frames)
                data, nonce = frames.request_frame(
                    self._signer, path, request_id, identity or "", b"".join(send)
                )
            else:
                nonce = sign_headers(
                    self._signer, extra, "POST", path, request_id, identity, send, length
                )
                head = self._head(path, request_id, identity, length, extra, pipelined=True)
                data = head + b"".join(send) if send else head
            future = pipe.expect(request_id, nonce)
            pipe.send(data)
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
            result = self._received(address, pipe, request_id, msg)
            if result is not RESEND:
                return result

    async def _open_pipe(self, pool: _LoopPool, address: str) -> Pipe:
        """The pipelined connection, opened once however many calls wait for it."""
        opening = pool.pipe_opening
        if opening is None:
            opening = pool.pipe_opening = asyncio.ensure_future(self._connect_pipe(address))
            opening.add_done_callback(pool.pipe_opened)
        with connect_errors(address):
            return await asyncio.shield(opening)

    async def _connect_pipe(self, address: str) -> Pipe:
        host, port = split_address(address)
        loop = asyncio.get_running_loop()
        signer, limit = self._signer, self.max_reply
        protocol = partial(
            Pipe, loop, lambda msg, nonce: check_reply_head(signer, address, msg, nonce, limit),
            partial(check_reply_body, signer, address), limit,
            partial(frames.check_reply, signer.keys, address),  # no Python frame of its own
            partial(self._received, address), partial(self._received_frame, address),
        )  # fmt: skip
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
            msg.body = await read_exactly_into(reader, length)
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
                    close_dead_transport(writer)
                    continue
                try:
                    loop.call_soon_threadsafe(writer.close)
                except RuntimeError:  # the loop closed meanwhile
                    close_dead_transport(writer)

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
