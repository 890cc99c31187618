"""``plain.encode_plain``: the same bytes as ``wire.encode`` for a plain payload, None for
anything ``encode`` would transform."""

from __future__ import annotations

import pytest

from corral.rpc import plain, wire


@pytest.mark.parametrize(
    "payload",
    [
        {"engine_name": None, "method": "noop", "args": [], "kwargs": {}},
        {
            "engine_name": "e",
            "method": "m",
            "args": [1, 2.5, "x", None, True],
            "kwargs": {"a": "é"},
        },
        {},
    ],
)
def test_a_plain_payload_is_encoded_as_encode_does(payload):
    body = plain.encode_plain(payload)
    assert body == b"".join(wire.encode(payload))
    assert wire.decode(body) == payload


@pytest.mark.parametrize(
    "payload",
    [
        {"a": float("nan")},
        {"a": [float("inf")]},
        {wire.TAG: 1},
        {"k": {wire.TAG: 1}},
        {"a": (1,)},
        {"a": [[1]]},
        {"a": [b"x"]},
        {1: 2},
        {"k": {1: 2}},
        {"a": {"b": {"c": 1}}},
    ],
)
def test_anything_encode_would_transform_is_left_to_it(payload):
    assert plain.encode_plain(payload) is None
