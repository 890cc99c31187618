"""The client's side of same-host shared memory (``rpc/shm.py``): which addresses are on this
host, the headers of one attempt, and the reply body when it comes in a segment."""

from __future__ import annotations

import os

from corral.errors import ProtocolError
from corral.rpc import shm
from corral.rpc.http import Message

MAX_SEGMENT = 1 << 40


_SHM_HEADERS = (shm.SEGMENT_HEADER, shm.RELEASED_HEADER, shm.OFFER_HEADER)


class SharedMemoryPeers:
    """Which addresses are on this host, and the shared-memory side of one request."""

    def __init__(self) -> None:
        self.token = shm.host_token()
        self.offer = f"{self.token} {os.getpid()}"
        self.local: dict[str, int] = {}  # address -> the server's pid
        self.remote: set[str] = set()

    def prepare(self, address: str, headers: dict[str, str], parts: list, fresh: bool) -> list:
        """Set the shared-memory headers; a large body to a local peer moves into a segment
        (kept alive by the returned list, which is sent instead of ``parts``). The offer
        rides only on a connection's first request (``fresh``): the server remembers it."""
        if headers:  # a retry: drop what the last attempt added (the usual fresh {}: nothing)
            for name in _SHM_HEADERS:
                headers.pop(name, None)
        if not self.token or address in self.remote:
            return parts
        if fresh:
            headers[shm.OFFER_HEADER] = self.offer
        pid = self.local.get(address)
        if pid is None:
            return parts
        released = shm.released_for(pid)
        if released:
            headers[shm.RELEASED_HEADER] = released
        if shm.wants_segment(parts, True):
            segment = shm.Segment.from_parts(parts, pid)
            headers[shm.SEGMENT_HEADER] = segment.descriptor()
            return _SegmentParts(segment)
        return parts

    def receive(self, address: str, reply: Message) -> memoryview | None:
        """The reply body if it is in a segment (None: read it from the socket)."""
        pid = reply.headers.get(shm.LOCAL_HEADER)
        if pid and pid.isdigit():
            self.local[address] = int(pid)
        shm.take_released(reply.headers.get(shm.RELEASED_HEADER), self.local.get(address))
        descriptor = reply.headers.get(shm.SEGMENT_HEADER)
        if descriptor is None:
            return None
        try:
            return shm.open_segment(descriptor, MAX_SEGMENT)
        except ProtocolError:
            return None

    def refused(self, address: str, reply: Message, body: memoryview | None) -> bool:
        """True if shared memory failed either way: stop using it for ``address``; the
        request is resent over the socket (same id: it runs at most once)."""
        failed = reply.headers.get(shm.REFUSED_HEADER) or (
            shm.SEGMENT_HEADER in reply.headers and body is None
        )
        if failed:
            self.local.pop(address, None)
            self.remote.add(address)
        return bool(failed)


class _SegmentParts(list):
    """No body bytes to send; holds the request's segment until the reply is in."""

    def __init__(self, segment: shm.Segment):
        super().__init__()
        self.segment = segment
