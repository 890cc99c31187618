"""The binary frame codec: round trips, exact buffers, refusals and size limits."""

from __future__ import annotations

import json
import math
import socket
import struct
import sys
from dataclasses import InitVar, dataclass, field

import numpy as np
import pytest
import torch

from corral.auth import AUTH_HEADER, sign_request_head
from corral.errors import ProtocolError
from corral.rpc import wire
from corral.rpc.http import MAX_HEAD_BYTES, SocketReader
from corral.rpc.server import Reply, RPCServer
from corral.rpc.wire import MAX_BUFFERS, MAX_HEADER_BYTES, TAG, DataclassRecord


def roundtrip(obj):
    return wire.decode(wire.encode_bytes(obj))


def roundtrip_writable(obj):
    return wire.decode(bytearray(wire.encode_bytes(obj)))


def raw_frame(header: object, buffers: list[bytes] = ()) -> bytes:
    """A frame built by hand, bypassing the encoder's checks."""
    body = json.dumps(header).encode() if not isinstance(header, bytes) else header
    prefix = struct.pack("<4sII", wire.MAGIC, len(body), len(buffers))
    prefix += struct.pack(f"<{len(buffers)}Q", *(len(b) for b in buffers))
    return prefix + body + b"".join(buffers)


# ---------------------------------------------------------------- scalars and containers

SCALARS = [
    None,
    True,
    False,
    0,
    -1,
    2**62,
    -(2**63),
    2**200,
    0.0,
    -0.0,
    1.5,
    1e308,
    5e-324,
    math.inf,
    -math.inf,
    "",
    "text",
    "ünïcødé ✓ \x00 \n",
    b"",
    b"\x00\xff" * 100,
]


@pytest.mark.parametrize("value", SCALARS, ids=repr)
def test_scalar_roundtrip(value) -> None:
    out = roundtrip(value)
    assert type(out) is type(value)
    assert out == value
    if isinstance(value, float):
        assert math.copysign(1, out) == math.copysign(1, value)


def test_nan_roundtrip() -> None:
    out = roundtrip(math.nan)
    assert isinstance(out, float) and math.isnan(out)
    out = roundtrip([math.nan, {"x": -math.inf}])
    assert math.isnan(out[0]) and out[1] == {"x": -math.inf}


def test_bytearray_and_memoryview_come_back_as_bytes() -> None:
    assert roundtrip(bytearray(b"abc")) == b"abc"
    assert roundtrip(memoryview(b"xyz")) == b"xyz"
    assert (
        roundtrip(memoryview(np.arange(4, dtype=np.int32)))
        == np.arange(4, dtype=np.int32).tobytes()
    )


def test_containers_roundtrip_with_their_types() -> None:
    value = {
        "list": [1, [2, [3, []]]],
        "tuple": (1, "a", (2.5, None)),
        "set": {1, 2, 3},
        "frozen": frozenset({"a"}),
        "empty": {},
        "empty_tuple": (),
        "bytes_in_list": [b"a", b"b"],
    }
    out = roundtrip(value)
    assert out["list"] == [1, [2, [3, []]]]
    assert out["tuple"] == (1, "a", (2.5, None)) and isinstance(out["tuple"][2], tuple)
    assert out["set"] == {1, 2, 3} and isinstance(out["set"], set)
    assert out["frozen"] == {"a"}
    assert out["empty"] == {} and out["empty_tuple"] == ()
    assert out["bytes_in_list"] == [b"a", b"b"]


def test_dict_with_non_str_keys() -> None:
    value = {1: "one", (2, "b"): [2], None: "none", 2.5: "f", False: "t", b"k": "bytes", "s": 1}
    out = roundtrip(value)
    assert out == value
    assert list(out) == list(value)  # order kept
    assert isinstance(next(k for k in out if isinstance(k, tuple)), tuple)


def test_dict_containing_the_tag_key_is_not_confused_with_a_tag() -> None:
    for value in (
        {TAG: "nd", "b": 0, "d": "<f4", "s": [1]},
        {TAG: "tuple", "v": [1]},
        {TAG: 1},
        {TAG: {TAG: "set", "v": []}},
    ):
        out = roundtrip(value)
        assert out == value
        assert type(out) is dict


def test_nested_tag_lookalikes_in_values() -> None:
    value = {"inner": {TAG: "bytes", "b": 7}, "list": [{TAG: "dc", "c": "os:system"}]}
    assert roundtrip(value) == value


# ---------------------------------------------------------------- dataclasses


@dataclass
class Inner:
    x: int
    data: np.ndarray | None = None


@dataclass
class Outer:
    name: str
    inners: list[Inner] = field(default_factory=list)
    meta: dict = field(default_factory=dict)
    pair: tuple = (1, 2)


@dataclass(frozen=True)
class Frozen:
    a: int = 1


@dataclass
class NoInitField:
    a: int
    b: int = field(init=False, default=5)


@dataclass
class NeedsInitVar:
    a: int
    factor: InitVar[int]

    def __post_init__(self, factor: int) -> None:
        self.a *= factor


def test_nested_dataclasses_roundtrip() -> None:
    value = Outer("o", [Inner(1), Inner(2, np.arange(3.0))], {"k": Inner(3)}, (Inner(4), Frozen(2)))
    out = roundtrip(value)
    assert isinstance(out, Outer)
    assert out.name == "o"
    assert all(isinstance(i, Inner) for i in out.inners)
    np.testing.assert_array_equal(out.inners[1].data, np.arange(3.0))
    assert out.meta == {"k": Inner(3)}
    assert out.pair == (Inner(4), Frozen(2))


def test_frozen_dataclass_as_dict_key_and_set_member() -> None:
    value = {Frozen(1): "a", "set": {Frozen(2)}}
    assert roundtrip(value) == value


def test_dataclass_with_a_field_outside_init_is_rebuilt_with_its_value() -> None:
    obj = NoInitField(1)
    obj.b = 7
    out = roundtrip(obj)
    assert isinstance(out, NoInitField) and (out.a, out.b) == (1, 7)


def test_dataclass_that_cannot_be_rebuilt_becomes_a_record() -> None:
    out = roundtrip(NeedsInitVar(2, 3))  # the InitVar is not a field: __init__ refuses
    assert isinstance(out, DataclassRecord)
    assert out == {"a": 6}
    assert out.class_path == f"{__name__}:NeedsInitVar"


def test_unloaded_dataclass_comes_back_as_record_and_reencodes_to_same_tag() -> None:
    tag = "corral_no_such_module.sub:Thing.Inner"
    frame = raw_frame({TAG: "dc", "c": tag, "v": {"a": 1, "b": [1, 2], "c": {TAG: "set", "v": []}}})
    out = wire.decode(frame)
    assert isinstance(out, DataclassRecord)
    assert out == {"a": 1, "b": [1, 2], "c": set()}
    assert out.class_path == tag
    assert "corral_no_such_module" not in sys.modules
    again = wire.encode_bytes(out)
    header = json.loads(again[12 : 12 + struct.unpack_from("<I", again, 4)[0]])
    assert header[TAG] == "dc" and header["c"] == tag
    assert wire.decode(again) == out and wire.decode(again).class_path == tag


def test_decoding_never_imports_the_named_module() -> None:
    for module in ("tabnanny", "antigravity", "this", "smtplib"):
        was_loaded = module in sys.modules
        out = wire.decode(raw_frame({TAG: "dc", "c": f"{module}:Anything", "v": {}}))
        assert isinstance(out, DataclassRecord)
        assert (module in sys.modules) == was_loaded, f"decode imported {module}"


def test_non_dataclass_class_path_is_never_called() -> None:
    # os:system, builtins:eval ... are loaded objects but not dataclasses: only a record.
    for path in ("os:system", "builtins:eval", "subprocess:Popen", "builtins:type"):
        out = wire.decode(raw_frame({TAG: "dc", "c": path, "v": {"args": "echo pwned"}}))
        assert isinstance(out, DataclassRecord) and out == {"args": "echo pwned"}


# ---------------------------------------------------------------- numpy

NUMPY_DTYPES = [
    "bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
    "float16", "float32", "float64", "longdouble", "complex64", "complex128",
    ">i4", ">f8", "<u2", "datetime64[ns]", "timedelta64[s]",
]  # fmt: skip
SHAPES = [(), (0,), (1,), (7,), (3, 4), (2, 0, 3), (2, 3, 4, 1)]


@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_numpy_roundtrip(dtype: str, shape: tuple) -> None:
    n = math.prod(shape)
    arr = (np.arange(n) % 7).astype(dtype).reshape(shape)
    for out in (roundtrip(arr), roundtrip_writable(arr)):
        assert isinstance(out, np.ndarray)
        assert out.dtype == arr.dtype
        assert out.shape == arr.shape
        np.testing.assert_array_equal(out, arr)


def test_numpy_zero_d_array_stays_an_array() -> None:
    arr = np.array(3.25, dtype=np.float32)
    out = roundtrip(arr)
    assert isinstance(out, np.ndarray) and out.shape == () and out == arr


def test_numpy_non_contiguous_views() -> None:
    base = np.arange(120, dtype=np.float64).reshape(4, 5, 6)
    for view in (base[:, ::2, 1::3], base.T, base[::-1], base[..., 0], np.asfortranarray(base)):
        out = roundtrip(view)
        assert out.shape == view.shape
        np.testing.assert_array_equal(out, view)


def test_numpy_buffer_is_raw_bytes_not_base64() -> None:
    arr = np.random.default_rng(0).random((256, 256))
    parts = wire.encode(arr)
    assert wire.frame_size(parts) < arr.nbytes + 200
    assert arr.tobytes() in wire.encode_bytes(arr)


def test_decoded_array_is_a_view_into_writable_frame() -> None:
    arr = np.arange(1000, dtype=np.int64)
    frame = bytearray(wire.encode_bytes(arr))
    out = wire.decode(frame)
    assert np.shares_memory(out, np.frombuffer(frame, dtype=np.uint8))


def test_numpy_scalar_becomes_python_scalar() -> None:
    assert roundtrip(np.float32(1.5)) == 1.5 and type(roundtrip(np.int64(7))) is int
    assert roundtrip(np.bool_(True)) is True


@pytest.mark.parametrize(
    "arr",
    [
        np.array(["a", "b"]),
        np.array([b"a"]),
        np.array([object(), 1], dtype=object),
        np.zeros(2, dtype=[("a", "i4"), ("b", "f4")]),
        np.zeros(2, dtype="V8"),
    ],
    ids=["unicode", "bytes", "object", "struct", "void"],
)
def test_unsupported_numpy_dtype_raises_type_error(arr) -> None:
    with pytest.raises(TypeError) as info:
        wire.encode(arr)
    assert str(arr.dtype) in str(info.value)


# ---------------------------------------------------------------- torch

TORCH_DTYPES = [
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int16,
    torch.int32, torch.int64, torch.uint8, torch.bool, torch.complex64, torch.complex128,
    torch.float8_e4m3fn, torch.float8_e5m2,
]  # fmt: skip


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(), (0,), (5,), (3, 4), (2, 0, 2), (2, 3, 4)], ids=str)
def test_torch_roundtrip(dtype, shape) -> None:
    t = (torch.arange(math.prod(shape)) % 5).to(dtype).reshape(shape)
    for out in (roundtrip(t), roundtrip_writable(t)):
        assert isinstance(out, torch.Tensor)
        assert out.dtype == dtype
        assert tuple(out.shape) == shape
        bits = out.reshape(-1).view(torch.uint8)
        assert torch.equal(bits, t.reshape(-1).view(torch.uint8))


def test_torch_bfloat16_keeps_its_bits() -> None:
    t = torch.randn(64, 33, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    out = roundtrip(t)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out.view(torch.int16), t.view(torch.int16))


def test_torch_bfloat16_frame_is_raw_size_without_upcast() -> None:
    t = torch.ones(1024, 512, dtype=torch.bfloat16)
    parts = wire.encode(t)
    size = wire.frame_size(parts)
    assert t.nbytes == 1024 * 512 * 2
    assert t.nbytes <= size <= t.nbytes + 256, f"frame {size} B for {t.nbytes} B of bf16"
    assert len(parts) == 3 and parts[2].nbytes == t.nbytes


def test_torch_non_contiguous_and_grad_tensors() -> None:
    base = torch.arange(60, dtype=torch.float32).reshape(3, 4, 5)
    for view in (base.transpose(0, 2), base[:, ::2], base[..., 1], base.expand(2, 3, 4, 5)):
        out = roundtrip(view)
        assert torch.equal(out, view)
    g = torch.ones(3, requires_grad=True) * 2
    out = roundtrip(g)
    assert torch.equal(out, g.detach()) and not out.requires_grad


def test_torch_tensor_inside_structures() -> None:
    value = {"w": [torch.zeros(2, dtype=torch.bfloat16)], ("k", 1): Inner(1, np.ones(2))}
    out = roundtrip(value)
    assert out["w"][0].dtype == torch.bfloat16
    assert isinstance(out[("k", 1)], Inner)


# ---------------------------------------------------------------- unsupported types


class Custom:
    pass


@pytest.mark.parametrize(
    "value,name",
    [
        (Custom(), "Custom"),
        (object(), "object"),
        (lambda: 1, "function"),
        (1 + 2j, "complex"),
        (range(3), "range"),
        (Inner, "type"),
        ([1, {"a": socket}], "module"),
        ({"deep": (1, [Custom()])}, "Custom"),
    ],
    ids=lambda v: type(v).__name__,
)
def test_unsupported_type_raises_type_error_naming_it(value, name: str) -> None:
    with pytest.raises(TypeError) as info:
        wire.encode(value)
    assert f"cannot send a {name} " in str(info.value)


# ---------------------------------------------------------------- size limits


def test_header_over_max_header_bytes_is_refused_by_encoder() -> None:
    with pytest.raises(ProtocolError, match="exceeds"):
        wire.encode("x" * (MAX_HEADER_BYTES + 10))


def test_header_length_over_limit_is_refused_by_decoder_before_reading() -> None:
    frame = struct.pack("<4sII", wire.MAGIC, MAX_HEADER_BYTES + 1, 0) + b"{}"
    with pytest.raises(ProtocolError, match="over the limits"):
        wire.decode(frame)


def test_too_many_buffers_is_refused_by_decoder() -> None:
    frame = struct.pack("<4sII", wire.MAGIC, 2, MAX_BUFFERS + 1) + b"{}"
    with pytest.raises(ProtocolError, match="over the limits"):
        wire.decode(frame)


def test_max_buffers_exactly_is_accepted() -> None:
    value = [b""] * MAX_BUFFERS
    assert wire.decode(wire.encode_bytes(value)) == value


def test_encoder_refuses_a_frame_the_decoder_would_refuse() -> None:
    """A frame with more than MAX_BUFFERS buffers must fail at the sender, not the worker."""
    with pytest.raises(ProtocolError):
        wire.encode([b"x"] * (MAX_BUFFERS + 1))


# ---------------------------------------------------------------- HTTP limits on a real server


def _frame_with_shape(value, shape: list[int]) -> bytes:
    """A valid frame of ``value`` whose header then claims ``shape`` for every array in it."""
    data = bytearray(wire.encode_bytes(value))
    header_len, n_buffers = struct.unpack_from("<II", data, 4)
    start = 12 + 8 * n_buffers
    header = json.loads(data[start : start + header_len])

    def claim(node):
        if isinstance(node, dict):
            if node.get(TAG) in ("nd", "pt"):
                node["s"] = shape
            for child in node.values():
                claim(child)
        elif isinstance(node, list):
            for child in node:
                claim(child)

    claim(header)
    new = json.dumps(header).encode()
    return bytes(data[:4] + struct.pack("<I", len(new)) + data[8:start] + new) + bytes(
        data[start + header_len :]
    )


@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize(
    "n,shape",
    [(4, [5]), (4, [3]), (4, [2, 3]), (4, []), (0, [2]), (0, [1, 1])],
    ids=["longer", "shorter", "2d-longer", "0d-of-4", "empty-buffer", "empty-buffer-2d"],
)
def test_array_whose_shape_does_not_fit_its_buffer_is_a_protocol_error(kind, n, shape) -> None:
    """The decoder checks length against shape itself (not left to numpy/torch)."""
    value = np.ones(n, np.float32) if kind == "numpy" else torch.ones(n, dtype=torch.float32)
    assert wire.decode(_frame_with_shape(value, [n])).shape == (n,)  # the frame is sound
    with pytest.raises(ProtocolError, match="does not fit"):
        wire.decode(_frame_with_shape(value, shape))


@pytest.mark.parametrize(
    "header,keep",
    [("", True), ("Connection: keep-alive\r\n", True), ("Connection: close\r\n", False),
     ("connection: Close\r\n", False)],
)  # fmt: skip
def test_connection_close_in_a_reply_head_means_no_keep_alive(header: str, keep: bool) -> None:
    from corral.rpc.http import parse_head

    msg = parse_head(f"HTTP/1.1 409 Conflict\r\n{header}Content-Length: 0".encode())
    assert msg.keep_alive is keep


SECRET = "s3cret-for-wire-tests"


@pytest.fixture
def server():
    calls: list[int] = []

    def handler(msg):
        calls.append(len(msg.body))
        return Reply(200, [b"ok"], "text/plain")

    srv = RPCServer(SECRET, handler, host="127.0.0.1", max_body=1 << 20).start()
    srv.calls = calls
    yield srv
    srv.stop()


def _read_reply(sock: socket.socket):
    reader = SocketReader(sock)
    msg = reader.read_head()
    assert msg is not None
    msg.body = reader.read_body(msg.content_length)
    return msg


def _auth(body: bytes = b"", length: int | None = None) -> str:
    return f"{AUTH_HEADER}: {sign_request_head(SECRET, 'POST', '/x', body, length=length)}"


def _closed(sock: socket.socket) -> bool:
    sock.settimeout(5)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_content_length_over_max_body_gets_413_and_close(server) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(
            f"POST /x HTTP/1.1\r\n{_auth(length=(1 << 20) + 1)}\r\n"
            f"Content-Length: {(1 << 20) + 1}\r\n\r\n".encode()
        )
        reply = _read_reply(sock)
        assert reply.status == 413
        assert reply.headers.get("connection") == "close"
        assert str(1 << 20) in bytes(reply.body).decode()
        assert _closed(sock)
    assert server.calls == []


def test_content_length_at_max_body_is_served(server) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        body = b"z" * (1 << 20)
        sock.sendall(
            f"POST /x HTTP/1.1\r\n{_auth(body)}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        assert _read_reply(sock).status == 200
    assert server.calls == [1 << 20]


def test_head_over_max_head_bytes_gets_400(server) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        filler = "".join(f"X-Pad-{i}: {'a' * 90}\r\n" for i in range(MAX_HEAD_BYTES // 90 + 50))
        head = f"POST /x HTTP/1.1\r\n{_auth()}\r\n{filler}".encode()
        assert len(head) > MAX_HEAD_BYTES + 1000
        sock.sendall(head)  # never terminated by a blank line
        reply = _read_reply(sock)
        assert reply.status == 400
        assert str(MAX_HEAD_BYTES) in bytes(reply.body).decode()
        assert _closed(sock)
    assert server.calls == []


@pytest.mark.parametrize("length", ["-1", "abc", "1e9", "0x10", " "])
def test_bad_content_length_gets_400(server, length: str) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(f"POST /x HTTP/1.1\r\n{_auth()}\r\nContent-Length: {length}\r\n\r\n".encode())
        reply = _read_reply(sock)
        assert reply.status == 400
        assert "Content-Length" in bytes(reply.body).decode()
    assert server.calls == []


@pytest.mark.parametrize(
    "head",
    [b"GARBAGE\r\n\r\n", b"POST /x HTTP/1.1\r\nno colon here\r\n\r\n"],
    ids=["start-line", "header-line"],
)
def test_malformed_http_head_gets_400(server, head: bytes) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(head)
        assert _read_reply(sock).status == 400
    assert server.calls == []


@pytest.mark.parametrize(
    "header, expected",
    [
        (b'{"a":[1,2.5,null,true],"b":"x"}', {"a": [1, 2.5, None, True], "b": "x"}),
        (b' {"a": 1} ', {"a": 1}),  # whitespace around the value: still read
        (b"[1,\n 2]", [1, 2]),
    ],
)
def test_a_frame_header_is_read_as_json_wherever_its_whitespace_is(header, expected):
    frame = wire._PREFIX.pack(wire.MAGIC, len(header), 0) + header
    assert wire.decode(frame) == expected


@pytest.mark.parametrize("header", [b'{"a":1}x', b'{"a":1', b"", b" ", b'{"a":1}{"b":2}'])
def test_a_frame_header_that_is_not_one_json_value_is_refused(header):
    frame = wire._PREFIX.pack(wire.MAGIC, len(header), 0) + header
    with pytest.raises(ProtocolError, match="not valid JSON"):
        wire.decode(frame)
