"""Cross-host broadcast relay: N remote readers of one ref cost about one transfer over the
owner's link, not N.

How: a reader on another host asks the owner for refs with ``/data/get`` and names itself
(``relay: "<worker id>#<generation>"``). If the values are large (``MIN_BYTES``), the owner
does not send them; it encodes them once into a frame (a ``Source``: views of the values,
no copy) and answers a *plan*: the frame's random id, its size, and the reader's
**upstream** -- the reader that asked just before it (a chain), or nobody (the owner
itself) for the first. Every reader then pulls the frame in ``CHUNK`` pieces with
``/data/chunk`` from its upstream into a ``Buffer``, and serves the pieces it already has
to its own downstream while it goes on pulling: the chain is pipelined, so it costs about
one transfer plus one chunk per hop, and the owner sends the bytes once.

Failures never hang a reader: a chunk the upstream does not have within ``WAIT`` seconds,
an upstream that is gone, unreachable, restarted or answers an error, all make the reader
pull the rest of the frame from the owner itself. Only the owner's own failure is an error
(``RefLostError``, as for a direct fetch).

Lifetimes: a reader keeps its buffer ``LINGER`` seconds after its last use (so later
readers can still pull from it), the owner keeps its source until the refs are freed.
Everything goes through the same signed requests as every other route; upstreams are
looked up in name-resolve by worker id (never taken from an address in a message) and
addressed with their ``id#generation`` identity.
"""

from __future__ import annotations

import logging
import mmap
import os
import secrets
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from corral.errors import CorralError, RefError

log = logging.getLogger("corral")

CHUNK = int(os.environ.get("CORRAL_RELAY_CHUNK", str(4 << 20)))
#: chunk requests a reader keeps in flight
DEPTH = int(os.environ.get("CORRAL_RELAY_DEPTH", "3"))
#: frames smaller than this are sent whole, as before
MIN_BYTES = int(os.environ.get("CORRAL_RELAY_MIN_BYTES", str(8 << 20)))
#: seconds a reader keeps its buffer after its last use, for later readers
LINGER = float(os.environ.get("CORRAL_RELAY_LINGER", "3"))
#: seconds a retired buffer's memory waits for the next frame: long enough for the next
#: weight broadcast of a training step, whose pages are then warm (a fresh 256 MiB buffer
#: costs ~0.2-0.3 CPU s of page faults and zeroing per reader, a warm one none)
POOL_IDLE = float(os.environ.get("CORRAL_RELAY_POOL_IDLE", "60"))
#: seconds a relay waits for a chunk it has not received yet before saying so
WAIT = float(os.environ.get("CORRAL_RELAY_WAIT", "30"))
#: seconds a relay waits for the buffer of a frame it was just named upstream of
APPEAR = 5.0
#: seconds a reader waits for its upstream's answer to one chunk request (a frozen or
#: cut-off upstream): then it turns to the owner
UPSTREAM_TIMEOUT = 2 * WAIT + 5
ENABLED = os.environ.get("CORRAL_RELAY", "1") != "0"


class RelayUnavailable(CorralError):
    """This worker cannot serve that part of the frame (not here, gone, or its own pull
    failed): the downstream reader pulls it from the owner instead."""


class Source:
    """The owner's side: one encoded frame of a key set, read in chunks (views, no copy)."""

    def __init__(self, keys: tuple[str, ...], parts: list):
        self.blob = secrets.token_hex(16)
        self.keys = keys
        self.parts = [memoryview(p).cast("B") for p in parts]
        self.size = sum(p.nbytes for p in self.parts)
        self.readers: list[tuple[str, float]] = []  # (identity, when it asked), in order

    def upstream_for(self, reader: str, now: float) -> str | None:
        """The last other reader that asked within ``LINGER`` (its buffer is still there),
        or None (the owner). Then ``reader`` joins the chain."""
        upstream = None
        for identity, when in reversed(self.readers):
            if now - when > LINGER:
                break
            if identity != reader:
                upstream = identity
                break
        self.readers = [(i, w) for i, w in self.readers if now - w <= LINGER and i != reader]
        self.readers.append((reader, now))
        return upstream

    def read(self, offset: int, size: int) -> memoryview | bytes:
        pieces, pos, end = [], 0, offset + size
        for part in self.parts:
            lo, hi = max(offset, pos), min(end, pos + part.nbytes)
            if lo < hi:
                pieces.append(part[lo - pos : hi - pos])
            pos += part.nbytes
            if pos >= end:
                break
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)


class Memory:
    """A 0600 memfd and its shared mapping: where a reader's buffer lives. Reused for the
    next frame of a fitting size once nothing refers to what it held (a broadcast of new
    weights every step then writes into warm pages instead of faulting fresh ones in)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.last_used = time.monotonic()
        self.fd = -1
        if hasattr(os, "memfd_create"):
            self.fd = os.memfd_create("corral-relay", os.MFD_CLOEXEC)
            os.fchmod(self.fd, 0o600)
            os.ftruncate(self.fd, capacity)
            self.map = mmap.mmap(self.fd, capacity, flags=mmap.MAP_SHARED)
        else:  # no memfd: anonymous memory, and readers decode a copy
            self.map = mmap.mmap(-1, capacity)
        self._closer = weakref.finalize(self, _close, self.fd, self.map)

    def close(self) -> None:
        self._closer()


def _close(fd: int, mapping: mmap.mmap) -> None:
    try:
        mapping.close()
    except BufferError:  # a view is still alive: the mapping goes with it
        pass
    if fd >= 0:
        os.close(fd)


class Buffer:
    """A reader's side: the frame as it arrives; served onwards as far as it is filled.

    The bytes live in a shared mapping of a memfd (written here, served from here); the
    reader's own values are decoded from a second, *private* mapping of it (``view()``):
    no copy, and an engine that writes into its arrays gets copy-on-write pages, never
    changing what later readers are served. Every view handed out is tracked, so the
    memory is reused only when none is left."""

    def __init__(self, blob: str, size: int, memory: Memory):
        self.blob = blob
        self.size = size
        self.memory = memory
        self.data = memory.map
        self.filled = 0
        self.failed: BaseException | None = None
        self.done = threading.Event()
        self.cond = threading.Condition()
        self.users = 0  # pulls or serves in progress
        self.last_used = time.monotonic()
        self._views: list[weakref.ref] = []

    def put(self, offset: int, chunk) -> None:
        view = memoryview(chunk).cast("B")
        if offset != self.filled or offset + view.nbytes > self.size:
            raise RefError(f"relay chunk at {offset} does not continue the frame at {self.filled}")
        self.data[offset : offset + view.nbytes] = view
        with self.cond:
            self.filled += view.nbytes
            self.cond.notify_all()

    def view(self) -> memoryview:
        """The whole frame, for this reader's own values (private, copy-on-write)."""
        if self.memory.fd < 0:
            return memoryview(bytearray(self.data[: self.size]))
        private = mmap.mmap(
            self.memory.fd, self.size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE
        )
        self._views.append(weakref.ref(private))
        return memoryview(private)

    def fail(self, exc: BaseException) -> None:
        with self.cond:
            self.failed = exc
            self.cond.notify_all()
        self.done.set()

    def read(self, offset: int, size: int, wait: float) -> Any:
        """Bytes ``offset..offset+size`` as a uint8 array (a view), once they are here."""
        import numpy as np

        end = offset + size
        if offset < 0 or size <= 0 or end > self.size:
            raise RefError(f"relay chunk {offset}+{size} is outside the frame of {self.size} B")
        with self.cond:
            self.cond.wait_for(lambda: self.filled >= end or self.failed is not None, wait)
            if self.filled < end:
                why = "its own pull failed" if self.failed is not None else f"not within {wait}s"
                raise RelayUnavailable(f"this relay does not have bytes {offset}+{size}: {why}")
        served = np.frombuffer(self.data, dtype=np.uint8, count=size, offset=offset)
        self._views.append(weakref.ref(served))
        return served

    def reusable(self) -> bool:
        """No view of the memory is alive (decoded values, replies being sent)."""
        return all(ref() is None for ref in self._views)


#: ``fetch(upstream identity or None for the owner, offset, size) -> bytes``
Fetch = Callable[[str | None, int, int], Any]


class Relays:
    """One worker's relay state: the sources it owns and the buffers it pulls or serves."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._appeared = threading.Condition(self._lock)  # a buffer was added
        self._gone: deque[str] = deque(maxlen=1024)  # frames this worker had and dropped
        self._sources: dict[tuple[str, ...], Source] = {}
        self._by_blob: dict[str, Source] = {}
        self._buffers: dict[str, Buffer] = {}
        self._idle: list[Memory] = []  # memory of retired buffers, for the next frame
        self._sweeper: threading.Thread | None = None
        self.served_bytes = 0  # frame bytes this worker sent to readers (owner or relay)
        self.relayed_bytes = 0  # of those, bytes served from a buffer (as a relay)
        self.fallbacks = 0  # pulls that had to turn to the owner

    # owner ------------------------------------------------------------------------
    def plan(self, keys: list[str], encode: Callable[[], list], reader: str) -> dict:
        """The plan for ``reader``: the frame's id and size, and its upstream."""
        ident = tuple(keys)
        with self._lock:
            source = self._sources.get(ident)
            if source is None:
                source = Source(ident, encode())
                self._sources[ident] = source
                self._by_blob[source.blob] = source
            upstream = source.upstream_for(reader, time.monotonic())
        return {"blob": source.blob, "size": source.size, "upstream": upstream}

    def dropped(self, keys: list[str]) -> None:
        """The owner freed ``keys``: sources holding any of them go."""
        gone = set(keys)
        with self._lock:
            for ident in [i for i in self._sources if gone.intersection(i)]:
                source = self._sources.pop(ident)
                self._by_blob.pop(source.blob, None)
                self._gone.append(source.blob)

    # serving -----------------------------------------------------------------------
    def chunk(self, blob: str, offset: int, size: int, wait: float = WAIT) -> memoryview | bytes:
        with self._lock:
            source = self._by_blob.get(blob)
            if source is None and blob not in self._buffers and blob not in self._gone:
                # the owner named us upstream a moment before our own pull began
                self._appeared.wait_for(
                    lambda: blob in self._buffers or blob in self._gone, min(wait, APPEAR)
                )
            buffer = self._buffers.get(blob) if source is None else None
            if buffer is not None:
                buffer.users += 1
        if source is not None:
            if offset < 0 or size <= 0 or offset + size > source.size:
                raise RefError(
                    f"relay chunk {offset}+{size} is outside the frame of {source.size} B"
                )
            data = source.read(offset, size)
            self._count(size, relayed=False)
            return data
        if buffer is None:
            raise RelayUnavailable(f"this worker holds no relay frame {blob[:8]}")
        try:
            data = buffer.read(offset, size, wait)
        finally:
            self._release(buffer)
        self._count(size, relayed=True)
        return data

    def count_direct(self, size: int) -> None:
        """A frame sent whole to a reader on another host (no relay)."""
        self._count(size, relayed=False)

    def _count(self, size: int, relayed: bool) -> None:
        with self._lock:
            self.served_bytes += size
            if relayed:
                self.relayed_bytes += size

    # reading -----------------------------------------------------------------------
    def pull(self, plan: dict, fetch: Fetch, chunk: int = CHUNK) -> memoryview:
        """The whole frame of ``plan``: from the upstream, the rest from the owner if the
        upstream fails. A frame this worker already has (or is pulling) is not pulled again."""
        blob, size, upstream = str(plan["blob"]), int(plan["size"]), plan.get("upstream")
        with self._lock:
            buffer = self._buffers.get(blob)
            mine = buffer is None
            if mine:
                buffer = self._buffers[blob] = Buffer(blob, size, self._memory(size))
                self._appeared.notify_all()
            buffer.users += 1
            self._ensure_sweeper()
        try:
            if not mine:
                buffer.done.wait()
                if buffer.failed is not None:
                    raise buffer.failed
                return buffer.view()
            self._fill(buffer, str(upstream) if upstream else None, fetch, chunk)
            buffer.done.set()
            return buffer.view()
        except BaseException as exc:
            if mine:
                buffer.fail(exc)
                with self._lock:
                    self._buffers.pop(blob, None)
                    self._gone.append(blob)
            raise
        finally:
            self._release(buffer)

    def _fill(self, buffer: Buffer, source: str | None, fetch: Fetch, chunk: int) -> None:
        """Fill ``buffer`` with ``DEPTH`` chunk requests in flight (so the hops of the chain
        and the copy into the buffer overlap), in order; on the upstream's first failure,
        the rest comes from the owner (``source`` None), from where the buffer stopped."""
        pool = ThreadPoolExecutor(DEPTH, thread_name_prefix="corral-relay-pull")
        pending: deque = deque()
        ahead = buffer.filled
        try:
            while buffer.filled < buffer.size:
                while len(pending) < DEPTH and ahead < buffer.size:
                    n = min(chunk, buffer.size - ahead)
                    pending.append((ahead, pool.submit(fetch, source, ahead, n)))
                    ahead += n
                offset, future = pending.popleft()
                try:
                    data = future.result()
                except Exception as exc:
                    if source is None:
                        raise
                    log.info("relay upstream %s failed (%s); pulling from the owner", source, exc)
                    with self._lock:
                        self.fallbacks += 1
                    # requests still out to the upstream end on their own (bounded): new
                    # threads for the owner's, from where the buffer stopped
                    pool.shutdown(wait=False, cancel_futures=True)
                    pool = ThreadPoolExecutor(DEPTH, thread_name_prefix="corral-relay-pull")
                    pending.clear()
                    source, ahead = None, buffer.filled
                    continue
                buffer.put(offset, data)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def _release(self, buffer: Buffer) -> None:
        with self._lock:
            buffer.users -= 1
            buffer.last_used = time.monotonic()

    # lifetimes ---------------------------------------------------------------------
    def _ensure_sweeper(self) -> None:
        if self._sweeper is None or not self._sweeper.is_alive():
            self._sweeper = threading.Thread(target=self._sweep, name="corral-relay", daemon=True)
            self._sweeper.start()

    def _sweep(self) -> None:
        """Drop buffers unused for ``LINGER`` seconds (their memory goes to the pool if no
        view of it is left) and pooled memory idle for ``POOL_IDLE``; stop when none is left."""
        while True:
            time.sleep(min(LINGER, 0.5) or 0.1)
            now = time.monotonic()
            with self._lock:
                for blob, buffer in list(self._buffers.items()):
                    if buffer.users == 0 and now - buffer.last_used > LINGER:
                        del self._buffers[blob]
                        self._gone.append(blob)
                        self._retire(buffer)
                self._trim_locked(now - POOL_IDLE)
                if not self._buffers and not self._idle:
                    self._sweeper = None
                    return

    def _retire(self, buffer: Buffer) -> None:
        if buffer.reusable() and buffer.memory.fd >= 0:
            buffer.memory.last_used = time.monotonic()
            self._idle.append(buffer.memory)
        # else: the memory goes when its last view does

    def _memory(self, size: int) -> Memory:
        for i, memory in enumerate(self._idle):
            if size <= memory.capacity <= 2 * size:
                return self._idle.pop(i)
        return Memory(size)

    def _trim_locked(self, before: float) -> None:
        keep = [m for m in self._idle if m.last_used > before]
        for memory in self._idle:
            if memory not in keep:
                memory.close()
        self._idle = keep

    def trim(self) -> None:
        """Drop pooled memory now (leak checks)."""
        with self._lock:
            self._trim_locked(float("inf"))

    def clear(self) -> None:
        with self._lock:
            self._sources.clear()
            self._by_blob.clear()
            for blob, buffer in list(self._buffers.items()):
                if not buffer.users:
                    del self._buffers[blob]
                    self._gone.append(blob)
                    self._retire(buffer)
            self._trim_locked(float("inf"))

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "relay_sources": len(self._sources),
                "relay_buffers": len(self._buffers),
                "relay_idle": len(self._idle),
                "served_bytes": self.served_bytes,
                "relayed_bytes": self.relayed_bytes,
                "relay_fallbacks": self.fallbacks,
            }
