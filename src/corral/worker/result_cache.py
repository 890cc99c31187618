"""The worker's replies by request id: a retried request is answered, not run again."""

from __future__ import annotations

import threading
from collections import OrderedDict

from corral.errors import ProtocolError
from corral.rpc import wire
from corral.rpc.envelope import failure
from corral.rpc.server import Reply

RESULT_CACHE_ENTRIES = 256
RESULT_CACHE_BYTES = 128 << 20
LARGE_REPLY_BYTES = 1 << 20
DELIVERED_IDS = 4096
BUSY = object()  # ``begin(..., wait=False)``: the same request id is running now


class ResultCache:
    """Replies by request id, so a retried request is answered without running twice.

    Bounded by entry count and bytes; the newest reply is always kept whatever its size,
    since a retry follows its failed attempt within seconds. A large reply is dropped as
    soon as its delivery is proven (the client's next request on the same connection);
    its id stays behind so a late duplicate is refused instead of run again."""

    def __init__(self) -> None:
        self._done: OrderedDict[str, Reply] = OrderedDict()
        self._sizes: dict[str, int] = {}  # of the replies in ``_done``
        self._delivered: OrderedDict[str, None] = OrderedDict()
        self._running: dict[str, threading.Event | None] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    def begin(self, request_id: str, wait: bool = True) -> Reply | object | None:
        """None if the caller should run the request; else the earlier reply. A duplicate
        of a request still running waits for it, or (``wait=False``) gets ``BUSY``."""
        while True:
            with self._lock:
                if request_id in self._done:
                    return self._done[request_id]
                if request_id in self._delivered:
                    return failure(
                        410,
                        ProtocolError(
                            f"request {request_id} was answered and its reply delivered already; "
                            "send a new request id to run the method again"
                        ),
                    )
                if request_id not in self._running:
                    # no Event until a duplicate has to wait for it (rare; saves one per call)
                    self._running[request_id] = None
                    return None
                if not wait:
                    return BUSY
                event = self._running[request_id]
                if event is None:
                    event = self._running[request_id] = threading.Event()
            event.wait()

    def delivered(self, request_id: str) -> None:
        """The client has read the whole reply: drop it if it is large."""
        with self._lock:
            size = self._sizes.get(request_id, 0)
            if size < LARGE_REPLY_BYTES:
                return
            del self._done[request_id], self._sizes[request_id]
            self._bytes -= size
            self._delivered[request_id] = None
            while len(self._delivered) > DELIVERED_IDS:
                self._delivered.popitem(last=False)

    def finish(self, request_id: str, reply: Reply) -> None:
        parts = reply.parts
        size = (
            len(parts[0]) if len(parts) == 1 and type(parts[0]) is bytes else wire.frame_size(parts)
        )
        with self._lock:
            self._bytes += size - self._sizes.get(request_id, 0)
            self._done[request_id] = reply
            self._sizes[request_id] = size
            while len(self._done) > 1 and (
                len(self._done) > RESULT_CACHE_ENTRIES or self._bytes > RESULT_CACHE_BYTES
            ):
                old, _ = self._done.popitem(last=False)
                self._bytes -= self._sizes.pop(old)
            event = self._running.pop(request_id)
        if event is not None:
            event.set()
