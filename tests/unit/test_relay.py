"""The relay's parts (corral/data/relay.py) without processes: the chain the owner hands out,
chunks read across a frame's parts, bounded waits, and pulls whose upstream fails midway."""

from __future__ import annotations

import gc
import os
import threading
import time

import numpy as np
import pytest

from corral.data import relay
from corral.data.relay import Buffer, Memory, Relays, RelayUnavailable, Source
from corral.errors import RefLostError
from corral.rpc import wire

FRAME = wire.encode([np.arange(40_000, dtype=np.float32), np.arange(9, dtype=np.int64)])
WHOLE = b"".join(bytes(p) for p in FRAME)

_MADE: list[Relays] = []


def _relays() -> Relays:
    """A Relays that is emptied when the test ends (see ``_relay_memory_released``)."""
    made = Relays()
    _MADE.append(made)
    return made


def _relay_memfds() -> list[str]:
    """This process's mappings and open descriptors of relay memory."""
    with open("/proc/self/maps") as fh:
        found = [line.split()[-2] for line in fh if "/memfd:corral-relay" in line]
    for entry in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{entry}")
        except OSError:
            continue
        if target.startswith("/memfd:corral-relay"):
            found.append(target)
    return found


@pytest.fixture(autouse=True)
def _relay_memory_released():
    """Each test's relays give their memory back when it ends. A Relays left alone keeps
    retired buffers' memfds pooled for POOL_IDLE (60 s), alive through its sweeper thread,
    in this pytest process: a later test's leak check (tests/conformance/test_data_plane.py
    counts the controller's corral memfds) would see them as its own leak."""
    yield
    while _MADE:
        _MADE.pop().clear()
    gc.collect()  # buffers made without a Relays close their memory when collected
    assert _relay_memfds() == [], "a relay test left relay memory mapped in this process"


def _owner() -> tuple[Relays, dict]:
    owner = _relays()
    plan = owner.plan(["k1", "k2"], lambda: FRAME, "r/0#g")
    return owner, plan


def test_the_owner_hands_out_a_chain_and_encodes_once():
    owner = _relays()
    encoded = []

    def encode():
        encoded.append(1)
        return FRAME

    plans = [owner.plan(["k"], encode, f"r/{i}#g") for i in range(4)]
    assert encoded == [1]
    assert len({p["blob"] for p in plans}) == 1 and plans[0]["size"] == len(WHOLE)
    assert [p["upstream"] for p in plans] == [None, "r/0#g", "r/1#g", "r/2#g"]
    # a reader asking again never becomes its own upstream
    assert owner.plan(["k"], encode, "r/3#g")["upstream"] == "r/2#g"


def test_readers_older_than_linger_are_not_upstreams():
    source = Source(("k",), FRAME)
    assert source.upstream_for("a#1", now=100.0) is None
    assert source.upstream_for("b#1", now=100.0 + relay.LINGER + 1) is None
    assert source.upstream_for("c#1", now=100.0 + relay.LINGER + 1) == "b#1"


def test_chunks_span_the_frame_parts_and_count_as_served():
    owner, plan = _owner()
    got = b"".join(
        bytes(owner.chunk(plan["blob"], off, min(1000, plan["size"] - off)))
        for off in range(0, plan["size"], 1000)
    )
    assert got == WHOLE
    assert owner.stats()["served_bytes"] == len(WHOLE)
    with pytest.raises(Exception, match="outside the frame"):
        owner.chunk(plan["blob"], plan["size"] - 1, 2)
    owner.dropped(["k2"])  # freeing any of its keys drops the source
    assert owner.stats()["relay_sources"] == 0
    with pytest.raises(RelayUnavailable):
        owner.chunk(plan["blob"], 0, 10)


def test_a_relay_serves_what_it_has_and_waits_bounded_for_the_rest():
    buffer = Buffer("b", 100, Memory(100))
    buffer.put(0, b"x" * 40)
    assert bytes(buffer.read(0, 40, wait=0)) == b"x" * 40
    with pytest.raises(RelayUnavailable, match="not within"):
        buffer.read(30, 20, wait=0.05)
    later = threading.Timer(0.05, lambda: buffer.put(40, b"y" * 60))
    later.start()
    assert bytes(buffer.read(90, 10, wait=10)) == b"y" * 10  # woken by the put
    failed = Buffer("c", 10, Memory(10))
    failed.fail(RuntimeError("boom"))
    with pytest.raises(RelayUnavailable, match="own pull failed"):
        failed.read(0, 5, wait=10)


def test_a_relay_named_before_its_own_pull_began_waits_for_its_buffer(monkeypatch):
    owner, plan = _owner()
    reader = _relays()
    got: list = []
    early = threading.Thread(target=lambda: got.append(bytes(reader.chunk(plan["blob"], 0, 10))))
    early.start()  # the downstream asks before this reader's pull has made its buffer
    reader.pull(plan, _fetcher(owner, plan["blob"], None, []))
    early.join(10)
    assert got == [WHOLE[:10]]
    monkeypatch.setattr(relay, "APPEAR", 0.05)
    with pytest.raises(RelayUnavailable, match="no relay frame"):
        reader.chunk("never-named-here", 0, 10)  # bounded: a frame that never comes


def _fetcher(owner: Relays, blob: str, upstream_dies_at: int | None, log: list):
    """fetch() for pull(): the owner's chunks; the upstream serves the bytes before offset
    ``upstream_dies_at``, then its connection breaks (0: it is gone from the start)."""

    def fetch(source, offset, size):
        log.append((source, offset))
        if source is not None and upstream_dies_at is not None and offset >= upstream_dies_at:
            raise ConnectionResetError("upstream died")
        return bytes(owner.chunk(blob, offset, size))

    return fetch


@pytest.mark.parametrize("dies_after", [0, 3])
def test_an_upstream_that_dies_midway_falls_back_to_the_owner(dies_after):
    owner, plan = _owner()
    reader = _relays()
    log: list = []
    plan = {**plan, "upstream": "r/9#g"}
    fetch = _fetcher(owner, plan["blob"], dies_after * 20_000, log)
    frame = reader.pull(plan, fetch, chunk=20_000)
    assert bytes(frame) == WHOLE
    assert reader.stats()["relay_fallbacks"] == 1
    from_owner = sorted(off for s, off in log if s is None)
    # the owner sends exactly the rest, continuing where the upstream stopped
    assert from_owner == list(range(dies_after * 20_000, len(WHOLE), 20_000))
    assert wire.decode(frame)[1].tolist() == list(range(9))


def test_chunk_requests_overlap_up_to_the_depth():
    owner, plan = _owner()
    reader = _relays()
    out, most, lock = [0], [0], threading.Lock()
    gate = threading.Barrier(relay.DEPTH, timeout=10)

    def fetch(source, offset, size):
        with lock:
            out[0] += 1
            most[0] = max(most[0], out[0])
        if offset < relay.DEPTH * 10_000:
            gate.wait()  # the first DEPTH requests are all out at once, or this times out
        with lock:
            out[0] -= 1
        return bytes(owner.chunk(plan["blob"], offset, size))

    assert bytes(reader.pull(plan, fetch, chunk=10_000)) == WHOLE
    assert most[0] == relay.DEPTH


def test_an_owner_failure_is_the_pull_error_and_drops_the_buffer():
    reader = _relays()

    def fetch(source, offset, size):
        raise RefLostError("owner gone", "o/0")

    with pytest.raises(RefLostError, match="owner gone"):
        reader.pull({"blob": "z", "size": 10, "upstream": None}, fetch)
    assert reader.stats()["relay_buffers"] == 0


def test_a_frame_pulled_once_serves_a_second_pull_and_downstream_readers():
    owner, plan = _owner()
    reader = _relays()
    log: list = []
    fetch = _fetcher(owner, plan["blob"], None, log)
    first = bytes(reader.pull(plan, fetch, chunk=50_000))
    calls = len(log)
    assert bytes(reader.pull(plan, fetch)) == first and len(log) == calls  # not pulled again
    assert bytes(reader.chunk(plan["blob"], 0, 100)) == WHOLE[:100]
    assert reader.stats()["relayed_bytes"] == 100
    mine = reader.pull(plan, fetch)  # this reader's values: a private mapping
    mine[:4] = b"ZZZZ"
    assert bytes(reader.chunk(plan["blob"], 0, 4)) == WHOLE[:4]  # later readers unaffected


def test_memory_is_reused_only_when_no_view_of_it_is_left():
    owner, plan = _owner()
    reader = _relays()
    fetch = _fetcher(owner, plan["blob"], None, [])
    mine = reader.pull(plan, fetch)  # this reader's values
    buffer = reader._buffers[plan["blob"]]
    assert not buffer.reusable()
    served = reader.chunk(plan["blob"], 0, 10)  # a chunk in a reply being sent
    del mine
    assert not buffer.reusable()
    del served
    assert buffer.reusable()
    with reader._lock:  # what the sweeper does once the buffer was idle for LINGER
        del reader._buffers[plan["blob"]]
        reader._retire(buffer)
    assert reader.stats()["relay_idle"] == 1
    with reader._lock:
        assert reader._memory(plan["size"]) is buffer.memory  # the next frame of that size
    kept = Buffer("y", 10, Memory(10))
    kept_view = kept.view()
    with reader._lock:
        reader._retire(kept)  # a view is alive: never pooled
    assert reader.stats()["relay_idle"] == 0
    del kept_view


def test_pooled_memory_outlives_the_gap_between_two_training_steps():
    """A buffer retired 20 s ago (one weight broadcast per training step) is still pooled
    and the next frame of its size gets it (warm pages); after POOL_IDLE it is dropped."""
    owner, plan = _owner()
    reader = _relays()
    mine = reader.pull(plan, _fetcher(owner, plan["blob"], None, []))
    del mine
    buffer = reader._buffers.pop(plan["blob"])
    with reader._lock:
        reader._retire(buffer)
        now = time.monotonic()
        buffer.memory.last_used = now - 20.0
        reader._trim_locked(now - relay.POOL_IDLE)  # what the sweeper does every 0.5 s
    assert reader.stats()["relay_idle"] == 1
    with reader._lock:
        assert reader._memory(plan["size"]) is buffer.memory
        reader._idle.append(buffer.memory)
        buffer.memory.last_used = now - relay.POOL_IDLE - 1.0
        reader._trim_locked(now - relay.POOL_IDLE)
    assert reader.stats()["relay_idle"] == 0
