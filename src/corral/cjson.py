"""JSON text through the standard library's own C codec (``_json``), without ``json``.

``import json`` loads ``json.decoder``, which compiles its patterns with ``re``, which
loads ``enum``: ~3 ms of a worker's ~25 ms start, for a worker that only ever parses and
writes JSON through the C scanner and encoder those modules wrap. This module builds that
scanner and encoder directly, so a worker's start (its settings, its registration record,
the wire's frame headers) imports neither ``json`` nor ``re`` (issue 29; the list is in
tests/integration/test_worker_start_imports.py).

What it accepts and writes is exactly ``json.loads`` / ``json.dumps`` (defaults): the
same C code does the work. Only errors take the long way: malformed text is parsed again
by ``json.loads``, which raises its usual ``json.JSONDecodeError`` (the C scanner, without
``json.decoder`` loaded, cannot build that exception itself). Where ``_json`` is missing
(an interpreter without CPython's accelerator) both functions are ``json``'s own.
"""

from __future__ import annotations

try:
    import _json
except ImportError:  # no C accelerator: the json package is the codec
    _json = None

_WHITESPACE = " \t\n\r"  # JSON's four whitespace characters (RFC 8259)
_CONSTANTS = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}


class _ScannerSettings:
    """What ``_json.make_scanner`` reads from ``json.JSONDecoder``: its defaults."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = _CONSTANTS.__getitem__
    memo: dict = {}


def _not_serializable(obj: object) -> object:
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


def _encoder(item_separator: str, key_separator: str, allow_nan: bool):
    """``json.dumps``' C encoder with these separators: no circular-reference markers (a
    cycle ends in RecursionError instead of ValueError), ASCII output."""
    return _json.make_encoder(
        None, _not_serializable, _json.encode_basestring_ascii, None,
        key_separator, item_separator, False, False, allow_nan,
    )  # fmt: skip


def _slow_loads(text: str):
    import json

    return json.loads(text)


def _slow_dumps(obj: object) -> str:
    import json

    return json.dumps(obj)


def _slow_dumps_compact(obj: object) -> str:
    import json

    return json.dumps(obj, separators=(",", ":"), allow_nan=False)


if _json is not None:
    _scan = _json.make_scanner(_ScannerSettings)
    _plain = _encoder(", ", ": ", True)
    _compact = _encoder(",", ":", False)

    def loads(text: str):
        """``json.loads(text)`` for a ``str``."""
        start = 0
        if text[:1] in _WHITESPACE:  # "" too: json.loads' own error below
            start = len(text) - len(text.lstrip(_WHITESPACE))
        try:
            value, end = _scan(text, start)
        except (StopIteration, ValueError, SystemError):
            return _slow_loads(text)  # malformed: json's own error, with its position
        if end != len(text) and text[end:].strip(_WHITESPACE):
            return _slow_loads(text)  # extra data after the value
        return value

    def dumps(obj: object) -> str:
        """``json.dumps(obj)``."""
        return "".join(_plain(obj, 0))

    def dumps_compact(obj: object) -> str:
        """``json.dumps(obj, separators=(",", ":"), allow_nan=False)``: how the wire writes
        its frame headers (non-finite floats raise ValueError)."""
        return "".join(_compact(obj, 0))

else:  # pragma: no cover - CPython always has _json
    loads = _slow_loads
    dumps = _slow_dumps
    dumps_compact = _slow_dumps_compact
