"""Refs without workers: the wire form, the worker's store, the controller's counting and
batched frees (with a recording stand-in for the scheduler's requests)."""

from __future__ import annotations

import dataclasses
import gc
import json
from types import SimpleNamespace

import numpy as np
import pytest

from corral import Ref, RefError, RefLostError
from corral.data.fetch import substitute
from corral.data.plane import DataPlane
from corral.data.store import ObjectStore, parse_keep
from corral.errors import ConfigError, ProtocolError
from corral.rpc import wire

TRIAL = "exp/t-unit"


def _ref(**changes) -> Ref:
    fields = dict(
        owner="a/0", key="k" * 32, dtype="float32", shape=(2, 3), nbytes=24,
        generation="g1", trial="exp/other", kind="nd",
    )  # fmt: skip
    fields.update(changes)
    return Ref(**fields)


def test_a_ref_crosses_the_wire_as_a_small_record():
    ref = _ref()
    found: list = []
    back = wire.decode(wire.encode_bytes({"x": [ref, (ref,)]}), found)
    assert back["x"][0] == ref and back["x"][1][0] == ref
    assert len(found) == 2 and back["x"][0].shape == (2, 3)
    assert len(wire.encode_bytes(ref)) < 400


def _frame_of(node: dict) -> bytes:
    header = json.dumps(node, separators=(",", ":")).encode()
    return wire._PREFIX.pack(wire.MAGIC, len(header), 0) + header


@pytest.mark.parametrize(
    "field, value",
    [("key", 5), ("shape", [-1]), ("shape", "2x3"), ("nbytes", -1), ("nbytes", True)],
)
def test_malformed_refs_on_the_wire_are_protocol_errors(field, value):
    node = _ref().to_wire()
    assert isinstance(wire.decode(_frame_of(node)), Ref)  # well-formed: decodes
    node[field] = value
    with pytest.raises(ProtocolError, match="ref"):
        wire.decode(_frame_of(node))


def test_a_missing_field_is_a_protocol_error():
    node = _ref().to_wire()
    del node["generation"]
    with pytest.raises(ProtocolError, match="lacks field"):
        wire.decode(_frame_of(node))


def test_a_freed_ref_cannot_be_sent():
    ref = _ref()
    ref.freed = True
    with pytest.raises(RefError, match="was freed"):
        wire.encode_bytes([ref])


def test_keep_accepts_true_a_threshold_or_nothing():
    assert parse_keep(True) == 0 and parse_keep(4096) == 4096
    assert parse_keep(False) is None and parse_keep(None) is None
    for bad in ("yes", -1, 1.5):
        with pytest.raises(ConfigError, match=r"rpc_meta\['keep'\]"):
            parse_keep(bad)


@dataclasses.dataclass
class Batch:
    tokens: np.ndarray
    n: int


def test_the_store_keeps_arrays_anywhere_and_the_same_array_once():
    store = ObjectStore("a/0", "g1", TRIAL)
    big = np.zeros(1000, dtype=np.float32)
    kept = store.keep_tree(
        {"b": Batch(big, 3), "l": [big, np.ones(2)], "t": (1, "x")}, min_bytes=100
    )
    assert isinstance(kept["b"].tokens, Ref) and kept["b"].n == 3
    assert kept["l"][0] == kept["b"].tokens  # same object, same ref
    assert isinstance(kept["l"][1], np.ndarray)  # under the threshold
    assert kept["t"] == (1, "x")
    assert store.stats()["refs"] == 1
    assert store.get([kept["l"][0].key], TRIAL, "g1")[0] is big


def test_the_store_names_what_is_wrong():
    store = ObjectStore("a/0", "g1", TRIAL)
    ref = store.put(np.ones(3))
    with pytest.raises(RefError, match="holds no ref with key 'nope'"):
        store.get(["nope"], TRIAL, "g1")
    with pytest.raises(RefError, match="cannot cross trials"):
        store.get([ref.key], "exp/other", "g1")
    with pytest.raises(RefLostError, match="earlier process of worker a/0"):
        store.get([ref.key], TRIAL, "g0")
    with pytest.raises(RefError, match="only numpy arrays and torch tensors"):
        store.put([1, 2])
    assert store.free([ref.key, "nope"]) == 1 and store.stats()["refs"] == 0


def test_substitute_replaces_refs_inside_any_container():
    ref = _ref()
    tree = {"a": [ref, {ref}], "b": (ref,), "c": Batch(ref, 1)}  # type: ignore[arg-type]
    value = object()
    got = substitute(tree, {id(ref): value})
    assert got["a"][0] is value and got["b"][0] is value and got["c"].tokens is value
    assert got["a"][1] == {value}


class _Recorder:
    def __init__(self):
        self.calls: list = []
        self.workers = {"a/0": SimpleNamespace(id="a/0", generation="g1")}

    def call(self, worker, path, payload, timeout):
        self.calls.append((worker.id, path, payload))
        return [np.arange(3)] * len(payload.get("keys", []))

    async def acall(self, worker, path, payload, timeout):
        return self.call(worker, path, payload, timeout)


def _plane(trial: str = TRIAL):
    rec = _Recorder()
    return DataPlane(trial, rec.workers.get, rec.call, rec.acall), rec


def test_a_ref_is_freed_once_its_last_copy_is_dropped():
    plane, rec = _plane()
    try:
        refs = wire.decode(wire.encode_bytes([_ref(trial=TRIAL), _ref(trial=TRIAL)]))
        first, second = refs  # two objects for one key: adopted twice
        del refs
        del first
        gc.collect()
        plane.flush()
        assert rec.calls == []  # one copy still alive
        del second
        gc.collect()
        plane.flush()
        frees = [c for c in rec.calls if c[1] == "/data/free"]
        assert frees == [("a/0", "/data/free", {"keys": ["k" * 32]})]
    finally:
        plane.close()


def test_free_and_fetch_go_to_the_owner_and_lost_owners_are_named():
    plane, rec = _plane()
    try:
        (ref,) = wire.decode(wire.encode_bytes([_ref(trial=TRIAL)]))
        assert list(ref.to_local()) == [0, 1, 2]
        assert rec.calls[-1][1] == "/data/get"
        plane.owner_gone(rec.workers["a/0"], "was deleted with delete_workers('a')")
        with pytest.raises(RefLostError, match=r"a/0 was deleted") as lost:
            ref.to_local()
        assert lost.value.owner == "a/0"
        ref.free()
        with pytest.raises(RefError, match="was freed"):
            ref.to_local()
    finally:
        plane.close()


def test_restarted_owner_and_unknown_owner():
    plane, rec = _plane()
    try:
        old = _ref(trial=TRIAL, generation="g0")
        with pytest.raises(RefLostError, match="was restarted"):
            plane.fetch([old])
        with pytest.raises(RefError, match="no worker of this trial"):
            plane.fetch([_ref(trial=TRIAL, owner="zz/9")])
        with pytest.raises(RefError, match="not to this scheduler's trial"):
            plane.fetch([_ref(trial="exp/else")])
    finally:
        plane.close()
