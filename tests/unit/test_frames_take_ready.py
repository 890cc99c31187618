"""``frames.take_ready``: a batch's loop reads each request frame's lengths once (issue 29)
and takes only a whole frame, checked as ``take_request`` checks it."""

from __future__ import annotations

import pytest

from corral.auth import RequestSigner, RequestVerifier, TrialKeys
from corral.errors import ProtocolError
from corral.rpc import frames

SECRET = "take-ready-secret"


def _frame(signer: RequestSigner, rid: str) -> bytes:
    return frames.request_frame(signer, "/call", rid, "", b"body")[0]


def test_a_whole_frame_is_taken_and_checked_and_a_part_of_one_is_left():
    keys = TrialKeys(SECRET)
    signer, verifier = RequestSigner(keys), RequestVerifier(keys)
    first, second = _frame(signer, "r1"), _frame(signer, "r2")
    buf = bytearray(first + second[:-1])
    msg, why, nonce = frames.take_ready(buf, verifier)
    assert why is None and msg.path == "/call" and bytes(msg.body) == b"body" and nonce
    assert frames.take_ready(buf, verifier) is None  # not all there: left as it is
    assert buf == second[:-1]
    buf += second[-1:]
    assert frames.take_ready(buf, verifier)[0].headers[frames.REQUEST_ID_HEADER] == "r2"
    assert frames.take_ready(bytearray(b"POST / HTTP/1.1\r\n"), verifier) is None


def test_a_replayed_or_altered_frame_is_refused_and_a_bad_kind_raises():
    keys = TrialKeys(SECRET)
    signer, verifier = RequestSigner(keys), RequestVerifier(keys)
    frame = _frame(signer, "r1")
    assert frames.take_ready(bytearray(frame), verifier)[1] is None
    assert "seen before" in frames.take_ready(bytearray(frame), verifier)[1]
    altered = bytearray(_frame(signer, "r2"))
    altered[-1] ^= 1
    assert "wrong frame MAC" in frames.take_ready(altered, verifier)[1]
    reply_kind = bytearray(frame)
    reply_kind[:2] = frames.REPLY
    with pytest.raises(ProtocolError):
        frames.take_ready(reply_kind, verifier)
