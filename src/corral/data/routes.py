"""The worker's data-plane routes: ``/data/get`` (values of refs it owns, or a relay plan),
``/data/chunk`` (a piece of a relayed frame), ``/data/free`` and ``/data/stats`` (what it
holds, for leak checks)."""

from __future__ import annotations

from corral.data import relay
from corral.data.store import ObjectStore
from corral.errors import CorralError, ProtocolError
from corral.rpc import shm, wire
from corral.rpc.envelope import failure, ok
from corral.rpc.http import Message
from corral.rpc.server import Reply


class DataRoutes:
    def __init__(self, store: ObjectStore, relays: relay.Relays):
        self.store = store
        self.relays = relays
        store.on_free = relays.dropped

    def get(self, msg: Message) -> Reply:
        """Values of refs this worker owns. Readers on this host share one segment; a large
        fetch by a reader on another host that offers to relay gets a relay plan."""
        try:
            p = wire.decode(msg.body)
            keys, trial, generation = list(p["keys"]), str(p["trial"]), str(p["generation"])
            reader = p.get("relay")
            values = self.store.get(keys, trial, generation)
        except (ProtocolError, KeyError, TypeError) as exc:
            return failure(400, ProtocolError(f"bad /data/get request: {exc}"))
        except CorralError as exc:
            return failure(500, exc)
        if msg.peer is None:
            if isinstance(reader, str) and relay.ENABLED:
                parts = wire.encode(values)
                if wire.frame_size(parts) >= relay.MIN_BYTES:
                    return ok({"relay": self.relays.plan(keys, lambda: parts, reader)})
            reply = ok(values)
            self.relays.count_direct(wire.frame_size(reply.parts))
            return reply

        def build() -> Reply:
            reply = ok(values)
            reply.segment = shm.Segment.from_parts(reply.parts)  # for every reader
            return reply

        return self.store.shared_reply(keys, build)

    def chunk(self, msg: Message) -> Reply:
        """Bytes ``offset..offset+size`` of relayed frame ``blob``, from the source (owner)
        or from this reader's buffer (waiting, bounded, for bytes still on their way)."""
        try:
            p = wire.decode(msg.body)
            blob, offset, size = str(p["blob"]), int(p["offset"]), int(p["size"])
        except (ProtocolError, KeyError, TypeError, ValueError) as exc:
            return failure(400, ProtocolError(f"bad /data/chunk request: {exc}"))
        import numpy as np  # a uint8 array: the reader gets a view of the body, no copy

        try:
            return ok(np.frombuffer(self.relays.chunk(blob, offset, size), dtype=np.uint8))
        except CorralError as exc:
            return failure(500, exc)

    def split(self, p: dict) -> list:
        """``/data/split``: refs to row ranges of a ref this worker owns (dispatch)."""
        spans = p.get("spans")
        if not isinstance(spans, list) or not all(
            isinstance(s, list) and len(s) == 2 and all(isinstance(x, int) for x in s)
            for s in spans
        ):
            raise ProtocolError(f"bad /data/split spans {spans!r}")
        return self.store.split(str(p["key"]), str(p["trial"]), str(p["generation"]), spans)

    def free(self, p: dict) -> int:
        return self.store.free([str(k) for k in p.get("keys", [])])

    def stats(self, p: dict) -> dict:
        """What this worker holds: refs, their bytes, shared-memory segments (after
        dropping idle ones when ``trim``), relay sources and buffers, bytes served."""
        if p.get("trim"):
            shm.POOL.trim()
            self.relays.trim()
        return {
            **self.store.stats(),
            **shm.POOL.counts(),
            **self.relays.stats(),
            "mapped": shm.mapped_segments(),
        }
