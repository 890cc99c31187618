"""The worker's data-plane routes: ``/data/get`` (values of refs it owns), ``/data/free``
and ``/data/stats`` (what it holds, for leak checks)."""

from __future__ import annotations

from corral.data.store import ObjectStore
from corral.errors import CorralError, ProtocolError
from corral.rpc import shm, wire
from corral.rpc.http import Message
from corral.rpc.server import Reply
from corral.worker.replies import failure, ok


class DataRoutes:
    def __init__(self, store: ObjectStore):
        self.store = store

    def get(self, msg: Message) -> Reply:
        """Values of refs this worker owns. Readers on this host share one segment."""
        try:
            p = wire.decode(msg.body)
            keys, trial, generation = list(p["keys"]), str(p["trial"]), str(p["generation"])
            values = self.store.get(keys, trial, generation)
        except (ProtocolError, KeyError, TypeError) as exc:
            return failure(400, ProtocolError(f"bad /data/get request: {exc}"))
        except CorralError as exc:
            return failure(500, exc)
        if msg.peer is None:
            return ok(values)

        def build() -> Reply:
            reply = ok(values)
            reply.segment = shm.Segment.from_parts(reply.parts)  # for every reader
            return reply

        return self.store.shared_reply(keys, build)

    def free(self, p: dict) -> int:
        return self.store.free([str(k) for k in p.get("keys", [])])

    def stats(self, p: dict) -> dict:
        """What this worker holds: refs, their bytes, shared-memory segments (after
        dropping idle ones when ``trim``)."""
        if p.get("trim"):
            shm.POOL.trim()
        return {**self.store.stats(), **shm.POOL.counts(), "mapped": shm.mapped_segments()}
