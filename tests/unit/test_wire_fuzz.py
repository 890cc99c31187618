"""Property tests of the frame decoder: hostile bytes may only ever raise ProtocolError.

Cases per run (hypothesis ``max_examples``): random bytes 800 + magic-prefixed bytes 600 +
mutated valid frames 1000 + generated headers 1000 + hostile dataclass tags 300
= 3700 generated cases, each under a per-example deadline.
"""

from __future__ import annotations

import json
import math
import struct
from datetime import timedelta

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.errors import ProtocolError
from corral.rpc import wire
from corral.rpc.wire import TAG

FUZZ = settings(
    deadline=timedelta(milliseconds=500),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,
    database=None,
)
N_RANDOM_BYTES = 800
N_MAGIC_BYTES = 600
N_MUTATIONS = 1000
N_HEADERS = 1000
N_DATACLASS_TAGS = 300
TOTAL_CASES = N_RANDOM_BYTES + N_MAGIC_BYTES + N_MUTATIONS + N_HEADERS + N_DATACLASS_TAGS
assert TOTAL_CASES >= 3000


def decode_or_protocol_error(data: bytes | bytearray) -> tuple[bool, object]:
    """Decode; a ProtocolError is fine, anything else propagates and fails the test."""
    try:
        return True, wire.decode(data)
    except ProtocolError as exc:
        assert str(exc), "a ProtocolError must say what is wrong"
        return False, exc


def frame(header_bytes: bytes, buffers: list[bytes]) -> bytes:
    prefix = struct.pack("<4sII", wire.MAGIC, len(header_bytes), len(buffers))
    prefix += struct.pack(f"<{len(buffers)}Q", *(len(b) for b in buffers))
    return prefix + header_bytes + b"".join(buffers)


# ---------------------------------------------------------------- (a) random bytes


@settings(FUZZ, max_examples=N_RANDOM_BYTES)
@given(st.binary(max_size=512))
def test_random_bytes_raise_only_protocol_error(data: bytes) -> None:
    ok, _ = decode_or_protocol_error(data)
    if not data.startswith(wire.MAGIC):
        assert not ok


@settings(FUZZ, max_examples=N_MAGIC_BYTES)
@given(
    header_len=st.integers(0, 2**32 - 1),
    n_buffers=st.integers(0, 2**32 - 1),
    rest=st.binary(max_size=512),
)
def test_magic_prefixed_random_bytes_raise_only_protocol_error(
    header_len: int, n_buffers: int, rest: bytes
) -> None:
    decode_or_protocol_error(struct.pack("<4sII", wire.MAGIC, header_len, n_buffers) + rest)


# ---------------------------------------------------------------- (b) mutated valid frames

leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.binary(max_size=40),
)
arrays = st.builds(
    lambda dtype, shape: (np.arange(math.prod(shape)) % 11).astype(dtype).reshape(shape),
    st.sampled_from(["int8", "uint16", "int64", "float32", "float64", "complex64", "bool"]),
    st.lists(st.integers(0, 4), max_size=3).map(tuple),
)
tensors = st.builds(
    lambda dtype, n: torch.arange(n).to(dtype),
    st.sampled_from([torch.bfloat16, torch.float16, torch.int32, torch.bool]),
    st.integers(0, 8),
)
values = st.recursive(
    st.one_of(leaf, arrays, tensors),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(st.text(max_size=8), inner, max_size=4),
        st.dictionaries(st.integers(), inner, max_size=3),
    ),
    max_leaves=12,
)

mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10_000), st.integers(1, 255)),
    st.tuples(st.just("truncate"), st.integers(0, 10_000), st.just(0)),
    st.tuples(st.just("extend"), st.binary(min_size=1, max_size=32), st.just(0)),
    st.tuples(st.just("header_len"), st.integers(0, 2**32 - 1), st.just(0)),
    st.tuples(st.just("n_buffers"), st.integers(0, 2**32 - 1), st.just(0)),
    st.tuples(st.just("buffer_len"), st.integers(0, 2**64 - 1), st.integers(0, 8)),
    st.tuples(st.just("header_byte"), st.integers(0, 10_000), st.integers(0, 255)),
)
json_corruption = st.none() | st.tuples(st.integers(0, 10_000), st.integers(0, 6))


def mutate(data: bytearray, op: tuple) -> bytearray:
    """One byte-level change; changes that do not apply to this frame are skipped."""
    kind, a, b = op
    if len(data) < 12:
        return data
    header_len, n_buffers = struct.unpack_from("<II", data, 4)
    header_start = 12 + 8 * n_buffers
    if kind == "flip":
        data[a % len(data)] ^= b
    elif kind == "truncate":
        del data[a % len(data) :]
    elif kind == "extend":
        data += a
    elif kind == "header_len":
        struct.pack_into("<I", data, 4, a)
    elif kind == "n_buffers":
        struct.pack_into("<I", data, 8, a)
    elif kind == "buffer_len" and n_buffers and 12 + 8 * n_buffers <= len(data):
        struct.pack_into("<Q", data, 12 + 8 * (b % n_buffers), a)
    elif kind == "header_byte" and header_len and header_start + header_len <= len(data):
        data[header_start + a % header_len] = b
    return data


def with_header(parts: list, header: object) -> bytearray:
    """The encoded frame with its header replaced (lengths fixed up)."""
    new = json.dumps(header).encode()
    prefix = bytearray(parts[0])
    struct.pack_into("<I", prefix, 4, len(new))
    return prefix + new + b"".join(bytes(p) for p in parts[2:])


def _corrupt_json(node, seed: int, how: int):
    """Change one tagged node of the header: its tag, buffer index, shape or dtype."""
    tagged = []

    def walk(n):
        if isinstance(n, dict):
            if TAG in n:
                tagged.append(n)
            for v in n.values():
                walk(v)
        elif isinstance(n, list):
            for v in n:
                walk(v)

    walk(node)
    if not tagged:
        return {TAG: ["nd", "pt", "dc", "zzz"][seed % 4], "b": seed}
    target = tagged[seed % len(tagged)]
    bad = [
        ("b", seed),
        ("b", -1),
        ("s", [seed, seed]),
        ("s", [-1]),
        ("d", ["O", "U4", "float128x", "torch.Tensor", "<V8", "i4,i4"][seed % 6]),
        (TAG, ["nd", "pt", "bytes", "set", "dict", "float", "tuple", "dc", "x"][seed % 9]),
        ("v", [None, 1, "nan", {"a": 1}, [[]]][seed % 5]),
    ][how]
    target[bad[0]] = bad[1]
    return node


@settings(FUZZ, max_examples=N_MUTATIONS)
@given(values, json_corruption, st.lists(mutation, max_size=3))
def test_mutated_frames_decode_or_raise_protocol_error(value, corruption, ops) -> None:
    parts = wire.encode(value)
    data = bytearray(b"".join(bytes(p) for p in parts))
    wire.decode(bytes(data))  # the unmutated frame decodes
    if corruption is not None:
        data = with_header(parts, _corrupt_json(json.loads(bytes(parts[1])), *corruption))
    for op in ops:
        data = mutate(data, op)
    decode_or_protocol_error(bytes(data))
    decode_or_protocol_error(data)  # writable frames take the zero-copy path


# ---------------------------------------------------------------- (c) generated headers

tags = st.one_of(
    st.sampled_from(["nd", "pt", "bytes", "set", "tuple", "dict", "float", "dc"]),
    st.text(max_size=6),
    st.integers(),
    st.none(),
    st.lists(st.integers(), max_size=2),
)
json_scalar = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**64), 2**64), st.floats(), st.text(max_size=10)
)
field_values = st.one_of(
    json_scalar,
    st.lists(st.integers(-3, 2**40), max_size=4),
    st.sampled_from(
        [
            "<f4",
            "|b1",
            "O",
            "U3",
            "float32",
            "bfloat16",
            "float8_e4m3fn",
            "complex128",
            "<M8[ns]",
            "(2,)i4",
            "V0",
            "S0",
            "nan",
            "inf",
            "os:system",
            "builtins:eval",
        ]
    ),  # fmt: skip
)


def tagged_node(children):
    return st.fixed_dictionaries(
        {TAG: tags},
        optional={
            "b": st.one_of(st.integers(-2, 4), field_values),
            "s": st.one_of(st.lists(st.integers(-2, 2**33), max_size=4), field_values),
            "d": field_values,
            "v": st.one_of(children, field_values),
            "k": st.one_of(children, field_values),
            "c": st.one_of(st.text(max_size=30), field_values),
            "dev": field_values,
        },
    )


headers = st.recursive(
    json_scalar,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.text(max_size=4), children, max_size=3),
        tagged_node(children),
    ),
    max_leaves=10,
)


@settings(FUZZ, max_examples=N_HEADERS)
@given(headers, st.lists(st.binary(max_size=24), max_size=4))
def test_generated_headers_raise_only_protocol_error(header, buffers) -> None:
    decode_or_protocol_error(frame(json.dumps(header).encode(), buffers))


dataclass_paths = st.sampled_from(
    [
        "corral.spec:SchedulingSpec",
        "corral.spec:SchedulingStrategy",
        "corral.spec:Job",
        "corral.spec:Worker",
        "corral.spec:NormalizedJob",
        "corral.config:BaseExperimentConfig",
        "corral.rpc.server:Reply",
        "corral.rpc.http:Message",
        "os:system",
        "builtins:eval",
        "corral.rpc.wire:DataclassRecord",
        "corral:__class__.__subclasses__",
        ":",
        "",
    ]
)


@settings(FUZZ, max_examples=N_DATACLASS_TAGS)
@given(
    dataclass_paths,
    st.dictionaries(
        st.sampled_from(["cpu", "gpu", "type", "target", "role", "id", "status", "x", "__init__"]),
        json_scalar,
        max_size=4,
    ),
)
def test_dataclass_tags_with_hostile_fields_raise_only_protocol_error(path, fields) -> None:
    """Loaded dataclasses are rebuilt with the frame's fields; a refusal by their own
    validation must still surface as ProtocolError (or a DataclassRecord)."""
    decode_or_protocol_error(frame(json.dumps({TAG: "dc", "c": path, "v": fields}).encode(), []))


# ---------------------------------------------------------------- fixed hostile frames


def test_deeply_nested_header_is_a_protocol_error() -> None:
    for depth in (5_000, 200_000):
        header = ("[" * depth + "]" * depth).encode()
        ok, exc = decode_or_protocol_error(frame(header, []))
        assert not ok and ("deep" in str(exc) or "JSON" in str(exc))


def test_huge_integer_literal_is_a_protocol_error() -> None:
    ok, _ = decode_or_protocol_error(frame(b"1" * 10_000, []))
    assert not ok


def test_array_shape_overflow_is_a_protocol_error() -> None:
    header = {TAG: "nd", "d": "<f8", "s": [2**62, 2**62, 0, 2**40], "b": 0}
    ok, exc = decode_or_protocol_error(frame(json.dumps(header).encode(), [b"x" * 8]))
    assert not ok and "does not fit" in str(exc)


def test_buffer_length_past_the_end_is_a_protocol_error() -> None:
    data = bytearray(wire.encode_bytes(b"abcdef"))
    struct.pack_into("<Q", data, 12, 2**64 - 1)
    ok, exc = decode_or_protocol_error(bytes(data))
    assert not ok and "truncated" in str(exc)


def test_trailing_bytes_after_the_last_buffer_are_a_protocol_error() -> None:
    ok, exc = decode_or_protocol_error(wire.encode_bytes([1, 2]) + b"\x00")
    assert not ok and "trailing" in str(exc)


@pytest.mark.parametrize("index", [-1, -2, 2, "0", None])
def test_a_buffer_index_outside_the_frame_is_a_protocol_error(index) -> None:
    """Negative indexes would wrap around to another buffer; they are refused."""
    header = {TAG: "bytes", "b": index}
    ok, exc = decode_or_protocol_error(frame(json.dumps(header).encode(), [b"ab", b"cd"]))
    assert not ok and "does not exist" in str(exc), exc


@pytest.mark.parametrize("dtype", ["|O", "|V8", "|S4", "<U2"])
def test_numpy_dtypes_outside_the_allowlist_are_refused_by_name(dtype) -> None:
    """Object, void (struct), bytes and str arrays are never built from a frame."""
    header = {TAG: "nd", "d": dtype, "s": [1], "b": 0}
    ok, exc = decode_or_protocol_error(frame(json.dumps(header).encode(), [b"\x00" * 8]))
    assert not ok and "refusing numpy dtype" in str(exc), exc


@pytest.mark.parametrize("name", ["load", "__class__", "Tensor", "qint8", "float"])
def test_torch_dtypes_outside_the_allowlist_are_refused_before_any_lookup(name) -> None:
    """The name is checked against the allowlist before ``getattr(torch, name)``."""
    header = {TAG: "pt", "d": name, "s": [1], "dev": "cpu", "b": 0}
    ok, exc = decode_or_protocol_error(frame(json.dumps(header).encode(), [b"\x00" * 4]))
    assert not ok and "refusing torch dtype" in str(exc), exc
