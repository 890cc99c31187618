"""Binary frames: a small JSON header describing the structure, then raw buffers.

Layout of one frame::

    b"CRL1" | u32 header_len | u32 n_buffers | n_buffers x u64 length | header | buffers

Arrays and tensors travel as their raw bytes (bf16 stays bf16); the header holds only
their dtype and shape. Dataclasses and Enum members travel as their class path and
values; ``torch.dtype`` values by name.

Decoding policy: by default decoding never imports a module named in the frame:
dataclasses and enums are rebuilt only if their class is already loaded (else a
dataclass stays a :class:`DataclassRecord` and an enum member its plain value), and torch
is imported only to rebuild tensors and dtypes. ``decode(..., import_types=True)`` also
imports the module a dataclass or enum names (a dotted module path, nothing else), as
AReaL's workers do; the worker runtime passes it only for requests whose signature
proved the sender holds the trial secret, so importing is never offered to strangers.
"""

from __future__ import annotations

import struct
import sys

from corral.cjson import dumps_compact as _JSON_ENCODE  # finite floats: _Encoder tags others
from corral.cjson import loads as _JSON_DECODE
from corral.errors import ProtocolError
from corral.rpc.ref import WIRE_TAG as _REF_TAG
from corral.rpc.ref import Ref

TYPE_CHECKING = False  # typing's, without importing typing (a worker's start)
if TYPE_CHECKING:
    from typing import Any

    import numpy as np

MAGIC = b"CRL1"
_PREFIX = struct.Struct("<4sII")
MAX_HEADER_BYTES = 16 * 1024 * 1024
MAX_BUFFERS = 1 << 16
TAG = "$t"
_TAG_BYTES = TAG.encode()
_NUMPY_KINDS = set("biufc?mM")
_PLAIN = (type(None), bool, int, str)
_INF = float("inf")  # math.isfinite(x) is -_INF < x < _INF: no math module at start
_MODULE_PATH = r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$"  # compiled (and cached) by re on first use
_TORCH_DTYPES = {
    "float32", "float64", "float16", "bfloat16", "int8", "int16", "int32", "int64",
    "uint8", "bool", "complex64", "complex128", "float8_e4m3fn", "float8_e5m2",
}  # fmt: skip


class DataclassRecord(dict):
    """A dataclass whose class is not loaded here: its fields, plus the class path so that
    sending it on (for example echoing it back) restores the dataclass at the other end."""

    def __init__(self, class_path: str, fields: dict):
        super().__init__(fields)
        self.class_path = class_path


class _Encoder:
    def __init__(self) -> None:
        self.buffers: list[memoryview] = []

    def _buffer(self, view: memoryview) -> int:
        self.buffers.append(view)
        return len(self.buffers) - 1

    def encode(self, obj: Any) -> Any:
        kind = type(obj)  # exact types first: the common case, without isinstance chains
        if kind is str or kind is int or kind is bool or obj is None:
            return obj
        if kind is dict and TAG not in obj:
            out = {}
            for key, value in obj.items():  # scalars copied without a call per value
                if type(key) is not str:
                    break
                t = type(value)
                out[key] = (
                    value
                    if t is str or t is int or t is bool or value is None
                    else self.encode(value)
                )
            else:
                return out
        elif kind is list:
            return [self.encode(x) for x in obj]
        enum = sys.modules.get("enum")  # an Enum exists only where enum is loaded
        if enum is not None and isinstance(obj, enum.Enum):
            cls = type(obj)
            return {
                TAG: "enum",
                "c": f"{cls.__module__}:{cls.__qualname__}",
                "v": self.encode(obj.value),
            }
        if isinstance(obj, bool | int | str):
            return obj
        if isinstance(obj, float):
            return obj if -_INF < obj < _INF else {TAG: "float", "v": repr(obj)}
        if isinstance(obj, list):
            return [self.encode(x) for x in obj]
        if isinstance(obj, tuple):
            return {TAG: "tuple", "v": [self.encode(x) for x in obj]}
        if isinstance(obj, DataclassRecord):
            fields = {k: self.encode(v) for k, v in obj.items()}
            return {TAG: "dc", "c": obj.class_path, "v": fields}
        if isinstance(obj, dict):
            if all(isinstance(k, str) for k in obj) and TAG not in obj:
                return {k: self.encode(v) for k, v in obj.items()}
            return {
                TAG: "dict",
                "k": [self.encode(k) for k in obj],
                "v": [self.encode(v) for v in obj.values()],
            }
        if isinstance(obj, Ref):
            return obj.to_wire()
        np = sys.modules.get("numpy")
        if np is not None and isinstance(obj, np.ndarray):
            return self._ndarray(obj)
        if np is not None and isinstance(obj, np.generic):
            return self.encode(obj.item())
        if isinstance(obj, bytes | bytearray | memoryview):
            return {TAG: "bytes", "b": self._buffer(memoryview(obj).cast("B"))}
        if _is_torch_tensor(obj):
            return self._tensor(obj)
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(obj, torch.dtype):
            return {TAG: "dtype", "v": str(obj).removeprefix("torch.")}
        # a dataclass exists only where its module is loaded (a worker may never load it)
        dcs = sys.modules.get("dataclasses")
        if dcs is not None and dcs.is_dataclass(obj) and not isinstance(obj, type):
            cls = type(obj)
            fields = {f.name: self.encode(getattr(obj, f.name)) for f in dcs.fields(obj)}
            return {TAG: "dc", "c": f"{cls.__module__}:{cls.__qualname__}", "v": fields}
        if isinstance(obj, set | frozenset):
            return {TAG: "set", "v": [self.encode(x) for x in obj]}
        raise TypeError(
            f"cannot send a {type(obj).__name__} over the wire: use None, bool, int, float, str, "
            "bytes, list, tuple, dict, set, dataclasses, numpy arrays or torch tensors"
        )

    def _ndarray(self, arr: np.ndarray) -> dict:
        import numpy as np

        if arr.dtype.kind not in _NUMPY_KINDS:
            raise TypeError(f"cannot send a numpy array of dtype {arr.dtype} (object/struct)")
        if not arr.flags.c_contiguous:
            arr = arr.copy(order="C")
        view = memoryview(arr.reshape(-1).view(np.uint8)) if arr.size else memoryview(b"")
        return {TAG: "nd", "d": arr.dtype.str, "s": list(arr.shape), "b": self._buffer(view)}

    def _tensor(self, tensor: Any) -> dict:
        import torch

        t = tensor.detach()
        device = str(t.device)
        t = t.cpu().contiguous()
        dtype = str(t.dtype).removeprefix("torch.")
        flat = t.reshape(-1)
        view = memoryview(flat.view(torch.uint8).numpy()) if flat.numel() else memoryview(b"")
        return {TAG: "pt", "d": dtype, "s": list(t.shape), "dev": device, "b": self._buffer(view)}


def _is_torch_tensor(obj: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def encode(obj: Any) -> list[memoryview | bytes]:
    """Encode ``obj`` into frame parts: write them in order (``sendmsg`` / ``writelines``)."""
    enc = _Encoder()
    header = _JSON_ENCODE(enc.encode(obj)).encode()
    if len(header) > MAX_HEADER_BYTES:
        raise ProtocolError(f"frame header of {len(header)} bytes exceeds {MAX_HEADER_BYTES}")
    if len(enc.buffers) > MAX_BUFFERS:
        raise ProtocolError(
            f"a frame holds at most {MAX_BUFFERS} arrays/buffers, not {len(enc.buffers)}"
        )
    if not enc.buffers:
        return [_PREFIX.pack(MAGIC, len(header), 0), header]
    lengths = [v.nbytes for v in enc.buffers]
    prefix = _PREFIX.pack(MAGIC, len(header), len(lengths)) + struct.pack(
        f"<{len(lengths)}Q", *lengths
    )
    return [prefix, header, *enc.buffers]


def frame_size(parts: list[memoryview | bytes]) -> int:
    total = 0
    for p in parts:
        total += p.nbytes if type(p) is memoryview else len(p)
    return total


def encode_bytes(obj: Any) -> bytes:
    return b"".join(bytes(p) for p in encode(obj))


def decode(
    data: bytes | bytearray | memoryview, refs: list | None = None, import_types: bool = False
) -> Any:
    """Decode one whole frame. Arrays are views into ``data`` when it is writable.
    ``refs``: a list that receives every ``corral.Ref`` found in the frame.
    ``import_types``: import the modules of dataclasses and enums (see the module doc)."""
    view = memoryview(data).cast("B")
    if view.nbytes < _PREFIX.size:
        raise ProtocolError(f"frame of {view.nbytes} bytes is shorter than its prefix")
    magic, header_len, n_buffers = _PREFIX.unpack_from(view, 0)
    if magic != MAGIC:
        raise ProtocolError(f"bad frame magic {bytes(magic)!r}, expected {MAGIC!r}")
    if header_len > MAX_HEADER_BYTES or n_buffers > MAX_BUFFERS:
        raise ProtocolError(f"frame header {header_len} B / {n_buffers} buffers over the limits")
    offset = _PREFIX.size
    table_end = offset + 8 * n_buffers
    if table_end + header_len > view.nbytes:
        raise ProtocolError("frame is truncated before the end of its header")
    lengths = struct.unpack_from(f"<{n_buffers}Q", view, offset) if n_buffers else ()
    header = bytes(view[table_end : table_end + header_len])
    pos = table_end + header_len
    buffers = []
    for length in lengths:
        if pos + length > view.nbytes:
            raise ProtocolError("frame is truncated inside a buffer")
        buffers.append(view[pos : pos + length])
        pos += length
    if pos != view.nbytes:
        raise ProtocolError(f"frame has {view.nbytes - pos} trailing bytes")
    try:
        tree = _JSON_DECODE(header.decode("utf-8"))  # json.loads, by the C scanner (cjson)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(f"frame header is not valid JSON: {exc}") from None
    if not buffers and _TAG_BYTES not in header:
        return tree  # plain JSON (no tagged node, no buffer): nothing to rebuild
    try:
        return _Decoder(buffers, refs, import_types).decode(tree)
    except ProtocolError:
        raise
    except RecursionError:
        raise ProtocolError("frame nests too deeply") from None
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, RuntimeError) as exc:
        # RuntimeError: what torch raises for a buffer it cannot view; never let a frame
        # reach the server as anything but a ProtocolError (a 400 reply)
        raise ProtocolError(f"malformed frame: {type(exc).__name__}: {exc}") from None


class _Decoder:
    def __init__(
        self, buffers: list[memoryview], refs: list | None = None, import_types: bool = False
    ):
        self.buffers = buffers
        self.refs = refs
        self.import_types = import_types

    def find_class(self, path: str) -> Any:
        """The class ``module:qualname`` names, or None (module not loaded and not
        importable under the policy, or no such attribute)."""
        module_name, _, qualname = str(path).partition(":")
        module: Any = sys.modules.get(module_name)
        if module is None and self.import_types and _is_module_path(module_name):
            import importlib

            try:
                module = importlib.import_module(module_name)
            except Exception as exc:
                raise ProtocolError(
                    f"cannot import module {module_name!r} to rebuild {qualname!r}: "
                    f"{type(exc).__name__}: {exc}; make it importable on the worker"
                ) from None
        cls = module
        for part in qualname.split("."):
            cls = getattr(cls, part, None) if cls is not None else None
        return cls if isinstance(cls, type) else None

    def ref(self, node: dict) -> Ref:
        ref = Ref.from_wire(node)
        if self.refs is not None:
            self.refs.append(ref)
        return ref

    def decode(self, node: Any) -> Any:
        if isinstance(node, list):
            return [self.decode(x) for x in node]
        if not isinstance(node, dict):
            return node
        tag = node.get(TAG)
        if tag is None:
            return {k: self.decode(v) for k, v in node.items()}
        handler = _DECODERS.get(tag) if isinstance(tag, str) else None
        if handler is None:
            raise ProtocolError(f"unknown frame tag {tag!r}")
        return handler(self, node)

    def buffer(self, node: dict) -> memoryview:
        index = node["b"]
        if not isinstance(index, int) or not 0 <= index < len(self.buffers):
            raise ProtocolError(f"frame refers to buffer {index!r} that does not exist")
        return self.buffers[index]

    def shape(self, node: dict) -> tuple[int, ...]:
        shape = node["s"]
        if not isinstance(shape, list) or not all(
            isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in shape
        ):
            raise ProtocolError(f"bad shape {shape!r}")
        return tuple(shape)

    def ndarray(self, node: dict) -> np.ndarray:
        import numpy as np

        dtype = np.dtype(node["d"])
        if dtype.kind not in _NUMPY_KINDS:
            raise ProtocolError(f"refusing numpy dtype {node['d']!r}")
        shape = self.shape(node)
        buf = self.buffer(node)
        if _count(shape) * dtype.itemsize != buf.nbytes:
            raise ProtocolError(f"array of shape {shape} {dtype} does not fit {buf.nbytes} bytes")
        return np.frombuffer(buf, dtype=dtype).reshape(shape)

    def tensor(self, node: dict) -> Any:
        name = node["d"]
        if name not in _TORCH_DTYPES:
            raise ProtocolError(f"refusing torch dtype {name!r}")
        import torch

        dtype = getattr(torch, name)
        shape = self.shape(node)
        buf = self.buffer(node)
        itemsize = torch.empty((), dtype=dtype).element_size()
        if _count(shape) * itemsize != buf.nbytes:
            raise ProtocolError(f"tensor of shape {shape} {name} does not fit {buf.nbytes} bytes")
        if buf.nbytes == 0:
            return torch.empty(shape, dtype=dtype)
        if buf.readonly:
            buf = memoryview(bytearray(buf))
        return torch.frombuffer(buf, dtype=dtype).reshape(shape)

    def dataclass(self, node: dict) -> Any:
        fields = {k: self.decode(v) for k, v in node["v"].items()}
        cls = self.find_class(node["c"])
        dcs = sys.modules.get("dataclasses")  # loaded wherever a dataclass is
        if cls is not None and dcs is not None and dcs.is_dataclass(cls):
            init = {f.name for f in dcs.fields(cls) if f.init}
            try:
                obj = cls(**{k: v for k, v in fields.items() if k in init})
            except (TypeError, ValueError):
                pass
            else:
                for name, value in fields.items():
                    if name not in init:
                        object.__setattr__(obj, name, value)
                return obj
        return DataclassRecord(str(node["c"]), fields)

    def enum(self, node: dict) -> Any:
        value = self.decode(node["v"])
        cls = self.find_class(node["c"])
        enum = sys.modules.get("enum")  # loaded wherever an Enum class is
        if cls is None or enum is None or not issubclass(cls, enum.Enum):
            return value
        try:
            return cls(value)
        except ValueError:
            raise ProtocolError(f"{node['c']} has no member with value {value!r}") from None

    def dtype(self, node: dict) -> Any:
        name = node["v"]
        if name not in _TORCH_DTYPES:
            raise ProtocolError(f"refusing torch dtype {name!r}")
        import torch

        return getattr(torch, name)


def _count(shape: tuple[int, ...]) -> int:
    """Elements in an array of ``shape``: ``math.prod``, without math at a worker's start."""
    count = 1
    for size in shape:
        count *= size
    return count


def _is_module_path(name: str) -> bool:
    """A dotted module path (``_MODULE_PATH``); ``re`` is loaded by the first one."""
    import re

    return re.fullmatch(_MODULE_PATH, name) is not None


def _float(_d: _Decoder, node: dict) -> float:
    if node["v"] not in ("nan", "inf", "-inf"):
        raise ProtocolError(f"bad float {node['v']!r}")
    return float(node["v"])


def _dict(d: _Decoder, node: dict) -> dict:
    keys = [_hashable(d.decode(k)) for k in node["k"]]
    values = [d.decode(v) for v in node["v"]]
    if len(keys) != len(values):
        raise ProtocolError("dict frame has unequal keys and values")
    return dict(zip(keys, values, strict=True))


def _hashable(key: Any) -> Any:
    if isinstance(key, list):
        return tuple(_hashable(k) for k in key)
    try:
        hash(key)
    except TypeError:
        raise ProtocolError(f"unhashable dict key of type {type(key).__name__}") from None
    return key


_DECODERS = {
    "tuple": lambda d, n: tuple(d.decode(x) for x in n["v"]),
    "set": lambda d, n: {_hashable(d.decode(x)) for x in n["v"]},
    "float": _float,
    "dict": _dict,
    "bytes": lambda d, n: bytes(d.buffer(n)),
    "nd": _Decoder.ndarray,
    "pt": _Decoder.tensor,
    "dc": _Decoder.dataclass,
    "enum": _Decoder.enum,
    "dtype": _Decoder.dtype,
    _REF_TAG: _Decoder.ref,
}
