"""The async client's connections to one address from one event loop: a bounded pool of
connections used one call at a time, and the pipelined connection (``rpc.pipeline``); how
a failed connect reads to the caller, and a large body read off such a connection."""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Iterator
from typing import Any

from corral.rpc.http import LARGE_BODY
from corral.rpc.pipeline import Pipe
from corral.rpc.protocol import CONNECT_TIMEOUT, WorkerUnreachableError


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
        if dead_loop:  # its calls cannot end on their loop: told so (``abandon``)
            pending, pipe.pending = pipe.pending, {}
            for future, _nonce, _finish in pending.values():
                abandon = getattr(future, "abandon", None)  # a PendingCall's
                if abandon is not None:
                    abandon()
            close_dead_transport(pipe)
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


def close_dead_transport(owner: asyncio.StreamWriter | Any) -> None:
    """Close the socket of ``owner.transport`` (a stream writer or a pipe) whose loop is
    closed (``close()`` would need the loop). Without this the socket waits for the
    garbage collector's cycle pass."""
    sock = getattr(owner.transport, "_sock", None)  # selector transports (CPython)
    if sock is not None:
        try:
            sock.close()
        except OSError:
            pass


@contextlib.contextmanager
def connect_errors(address: str) -> Iterator[None]:
    """A failed connect as the caller's errors: TimeoutError naming the address and the
    limit, WorkerUnreachableError for anything the socket raised."""
    try:
        yield
    except TimeoutError:
        raise TimeoutError(f"could not connect to {address} within {CONNECT_TIMEOUT}s") from None
    except OSError as exc:
        raise WorkerUnreachableError(address, exc) from None


async def read_exactly_into(reader: asyncio.StreamReader, length: int) -> memoryview:
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
