"""The keys sign with HMAC-SHA256 whichever keyed object copies them: OpenSSL's own
(``_hashlib``, the fast path, issue 29) or, where there is none, ``hmac.new``'s."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from corral import auth

FIELDS = ["corral-reply", "v1", "200", "n-1", "application/x-corral-frame", "10", "d", ""]


@pytest.mark.parametrize("openssl", [True, False], ids=["openssl", "portable"])
def test_each_keyed_object_signs_hmac_sha256(monkeypatch, openssl):
    if not openssl:
        monkeypatch.setattr(auth, "_openssl_hmac", None)
    keys = auth.TrialKeys("s" * 64)
    for key in (keys.request, keys.reply, keys.record):
        want = hmac.new(key, "\n".join(FIELDS).encode(), hashlib.sha256).hexdigest()
        assert keys.sign(key, FIELDS) == want
        assert keys.sign(key, FIELDS) == want  # copied per message, never consumed


def test_a_digest_openssl_refuses_falls_back_to_the_portable_object(monkeypatch):
    def refuses(key, digestmod):
        raise ValueError(f"unsupported hash type {digestmod}")

    monkeypatch.setattr(auth, "_openssl_hmac", refuses)
    keys = auth.TrialKeys("s" * 64)
    want = hmac.new(keys.reply, "\n".join(FIELDS).encode(), hashlib.sha256).hexdigest()
    assert keys.sign(keys.reply, FIELDS) == want
