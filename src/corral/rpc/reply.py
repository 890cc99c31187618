"""What a worker's request handler returns to the RPC server: a ``Reply`` to send now, or
a ``Deferred`` one made on another thread."""

from __future__ import annotations

from collections.abc import Callable

TYPE_CHECKING = False  # typing's, without importing typing (a worker's start)
if TYPE_CHECKING:
    from typing import Any


class Reply:
    """A reply's status, body parts and content type. ``segment``: a prebuilt
    shared-memory copy of ``parts`` (sent instead when the peer is local). A plain class,
    not a dataclass: a worker's start does not import ``dataclasses`` (and ``inspect``)."""

    __slots__ = ("status", "parts", "content_type", "segment")

    def __init__(
        self,
        status: int = 200,
        parts: list | None = None,
        content_type: str = "application/x-corral-frame",
        segment: Any = None,
    ):
        self.status = status
        self.parts = [] if parts is None else parts
        self.content_type = content_type
        self.segment = segment

    def __repr__(self) -> str:
        return f"Reply({self.status}, {len(self.parts)} part(s), {self.content_type!r})"


class Deferred:
    """A reply made on another thread: the handler returns it, the server calls
    ``start(send)`` and goes on reading the connection; ``send(reply)`` is then called
    exactly once, on that other thread, and writes the reply (under the connection's write
    lock). Only for keep-alive requests.

    ``lends=True`` (a synchronous engine call, made on the engine thread): the server calls
    ``start(send, lease)``, where ``lease`` (``rpc.connection.Lease``, or None on a pipelined
    connection) must, after ``send``, get ``lease.serve_here(park)`` on that thread (it
    gives the connection back itself) or ``lease.give_back()``."""

    __slots__ = ("start", "lends")

    def __init__(self, start: Callable[..., None], lends: bool = False):
        self.start = start
        self.lends = lends
