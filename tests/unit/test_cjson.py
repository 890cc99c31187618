"""corral.cjson parses and writes what ``json.loads`` / ``json.dumps`` do (the same C
codec, without importing json), and refuses what they refuse with json's own error."""

from __future__ import annotations

import json
import math

import pytest

from corral import cjson

DOCUMENTS = [
    '{"type": "nfs", "root": "/tmp/corral-x/records"}',
    '  {"a": [1, -2, 3.5, 1e300, -0.0, true, false, null], "b": {"c": "\\u00e9\\n\\"x\\""}}\n',
    "[]",
    "{}",
    '"just a string"',
    "12345678901234567890123",
    "\t[1,2 , 3]\r\n",
    '{"nested": [[[{"k": [null]}]]]}',
]


@pytest.mark.parametrize("text", DOCUMENTS)
def test_loads_reads_what_json_reads(text):
    assert cjson.loads(text) == json.loads(text)


def test_loads_reads_json_constants_as_json_does():
    value = cjson.loads("[NaN, Infinity, -Infinity]")
    assert math.isnan(value[0]) and value[1:] == [math.inf, -math.inf]


@pytest.mark.parametrize(
    "text", ["", "   ", '{"a" 1}', '"open', "[1 2]", '{"a": 1,}', "[1] [2]", "{} x", "nul"]
)
def test_loads_refuses_what_json_refuses_with_its_error(text):
    with pytest.raises(json.JSONDecodeError) as ours:
        cjson.loads(text)
    with pytest.raises(json.JSONDecodeError) as theirs:
        json.loads(text)
    assert str(ours.value) == str(theirs.value)


VALUES = [
    {"pid": 12, "host": "n1", "worker_ports": ["1", "2"], "gpus": None, "forked": False},
    {"é": 'ü\n\t"', "nested": [1, 2.5, [True, None]], "": {}},
    [1e-7, 1e22, -0.0, 2**70],
    "text",
]


@pytest.mark.parametrize("value", VALUES)
def test_dumps_writes_what_json_writes(value):
    assert cjson.dumps(value) == json.dumps(value)
    compact = json.dumps(value, separators=(",", ":"), allow_nan=False)
    assert cjson.dumps_compact(value) == compact


def test_dumps_writes_non_finite_floats_as_json_does_and_compact_refuses_them():
    assert cjson.dumps([math.inf, -math.inf]) == json.dumps([math.inf, -math.inf])
    with pytest.raises(ValueError):
        cjson.dumps_compact([math.nan])


def test_dumps_refuses_what_json_cannot_write():
    with pytest.raises(TypeError, match="Object of type object is not JSON serializable"):
        cjson.dumps({"x": object()})
    with pytest.raises(TypeError):
        cjson.dumps_compact({1.5j: 1})


@pytest.mark.parametrize("text", ['{"a" 1}', '"open', "[1 2]"])
def test_loads_refuses_with_jsons_error_before_json_decoder_is_loaded(monkeypatch, text):
    """In a worker, which has not loaded ``json.decoder``, the C scanner cannot build its
    exception and raises SystemError instead (it looks the class up in sys.modules); the
    text is then parsed again by json, for json's own error. (Removing json.decoder from
    this process's sys.modules would break json.loads itself, which uses the same C
    scanner: the scanner stands in for it here.)"""

    def scanner_without_json_decoder(text, start):
        raise SystemError("<_json.Scanner object> returned NULL without setting an exception")

    monkeypatch.setattr(cjson, "_scan", scanner_without_json_decoder)
    with pytest.raises(json.JSONDecodeError):
        cjson.loads(text)
