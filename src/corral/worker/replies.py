"""How a request is answered: its endpoint's ``Route``, whether an engine call takes the
path with refs, and the reply of a synchronous call queued on the engine thread (the
envelope itself: ``rpc.envelope``)."""

from __future__ import annotations

from corral.errors import CorralError
from corral.rpc.envelope import failure, ok


def uses_refs(payload: dict) -> bool:
    """Refs in the arguments (resolved, maybe fetched, first) or a result to keep: such
    calls take the ordinary path through ``_call``."""
    return bool(payload.get("_refs")) or payload.get("keep") is not None


class EngineCallReply:
    """A synchronous engine call queued on the engine thread; it replies itself, then (on a
    one-request-at-a-time connection) serves that connection's next request there too."""

    __slots__ = ("finish", "request_id", "fn", "send", "lease", "park")

    def __init__(self, finish, request_id: str | None, fn, send, lease=None, park=None):
        """``finish(request_id, reply)``: the runtime's result cache takes the reply and
        gives it back; ``send``: the reply goes to the connection. ``lease``: the
        connection lent to the engine thread (``rpc.connection.Lease``), or None;
        ``park``: ``EngineHost.park``, how the engine thread waits on it."""
        self.finish, self.request_id, self.fn, self.send = finish, request_id, fn, send
        self.lease, self.park = lease, park

    def run(self) -> None:
        try:
            try:
                reply = ok(self.fn())
            except Exception as exc:
                reply = failure(500, exc)
            self.send(self.finish(self.request_id, reply))
        except BaseException:
            if self.lease is not None:  # never leave the connection's thread waiting
                self.lease.give_back()
            raise
        if self.lease is not None:
            self.lease.serve_here(self.park)

    def cancel(self) -> None:
        stopping = CorralError("the worker is stopping; the call did not run")
        self.send(self.finish(self.request_id, failure(503, stopping)))
        if self.lease is not None:
            self.lease.give_back()


class Route:
    """How ``WorkerRuntime.handle`` runs one endpoint. ``raw``: ``fn`` gets the request
    itself and its reply goes out as is (reads only: not decoded, not cached). Otherwise
    ``fn`` gets the decoded payload and its result is sent in the envelope, cached by
    request id. ``engine_call``: a synchronous engine method runs on the engine thread,
    which replies itself (a worker's fast path). ``inline``: quick, never blocks: run on
    the connection's thread even when pipelined (a worker's first requests, ``/set_env``
    and ``/configure``, do not make the pool: ``concurrent.futures`` with ``logging``).
    ``rebuild``: decode with ``import_types`` (all but ``/configure``: worker/seeding.py)."""

    __slots__ = ("fn", "raw", "engine_call", "inline", "rebuild")

    def __init__(
        self, fn, raw: bool = False, engine_call: bool = False, inline: bool = False,
        rebuild: bool = True,
    ):  # fmt: skip
        self.fn, self.raw, self.engine_call, self.inline = fn, raw, engine_call, inline
        self.rebuild = rebuild
