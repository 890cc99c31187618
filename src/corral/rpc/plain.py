"""A plain payload's wire frame without the encoder's walk (a small engine call's).

``wire.encode`` walks every value to find what it must tag (bytes, arrays, tuples,
dataclasses, non-finite floats, ...). A dict with string keys whose values are JSON
scalars or lists / string-keyed dicts of them has nothing to tag: its frame is the
prefix and its JSON header, the same bytes ``wire.encode`` makes
(``tests/unit/test_wire_plain.py``).
"""

from __future__ import annotations

import struct

from corral.cjson import dumps_compact
from corral.rpc.wire import MAGIC, MAX_HEADER_BYTES, TAG

_PREFIX = struct.Struct("<4sII")  # wire's: magic, header length, no buffers
_PLAIN = frozenset((str, int, float, bool, type(None)))


def encode_plain(obj: dict) -> bytes | None:
    """``b"".join(wire.encode(obj))`` for a plain dict (module docstring); None for
    anything else."""
    if TAG in obj:
        return None
    plain = _PLAIN
    for key, value in obj.items():
        kind = type(value)
        if kind in plain:
            pass
        elif kind is list:
            for item in value:
                if type(item) not in plain:
                    return None
        elif kind is dict:
            if TAG in value:
                return None
            for k, v in value.items():
                if type(k) is not str or type(v) not in plain:
                    return None
        else:
            return None
        if type(key) is not str:
            return None
    try:
        header = dumps_compact(obj).encode()
    except ValueError:  # a float that is not finite: ``wire.encode`` tags it
        return None
    if len(header) > MAX_HEADER_BYTES:
        return None
    return _PREFIX.pack(MAGIC, len(header), 0) + header
