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


# RFC 4231, test case 2: HMAC-SHA256 of "what do ya want for nothing?" under "Jefe"
RFC4231_KEY, RFC4231_DATA = b"Jefe", b"what do ya want for nothing?"
RFC4231_MAC = "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
LABELS = ("request", "reply", "body", "record", "frame-request", "frame-reply")


@pytest.mark.parametrize("openssl", [True, False], ids=["openssl", "portable"])
def test_the_one_shot_hmac_is_hmac_sha256(monkeypatch, openssl):
    """``auth.hmac_sha256`` (OpenSSL's one-shot HMAC from ``_hashlib``, without importing
    hmac and hashlib at a worker's start) against RFC 4231 and the hmac module."""
    if not openssl:
        monkeypatch.setattr(auth, "_openssl_hmac_digest", None)
    assert auth.hmac_sha256(RFC4231_KEY, RFC4231_DATA).hex() == RFC4231_MAC
    for key, data in ((b"k" * 100, b""), (b"", b"x" * 1000), (bytes(range(64)), b"\n\0")):
        assert auth.hmac_sha256(key, data) == hmac.new(key, data, hashlib.sha256).digest()


@pytest.mark.parametrize("openssl", [True, False], ids=["openssl", "portable"])
def test_the_derived_keys_and_an_unkeyed_signature_are_hmac_sha256(monkeypatch, openssl):
    if not openssl:
        monkeypatch.setattr(auth, "_openssl_hmac_digest", None)
        monkeypatch.setattr(auth, "_openssl_hmac", None)
    secret = "s" * 64
    keys = auth.TrialKeys(secret)
    for label in LABELS:
        want = hmac.new(secret.encode(), b"corral/" + label.encode(), hashlib.sha256).digest()
        assert getattr(keys, label.replace("-", "_")) == want, label
    other = b"a key TrialKeys holds no keyed object for"
    want = hmac.new(other, "\n".join(FIELDS).encode(), hashlib.sha256).hexdigest()
    assert keys.sign(other, FIELDS) == want


def test_the_body_digest_is_sha256():
    keys = auth.TrialKeys("s" * 64)
    for body in (b"", b"x" * 100, b"y" * 5000):
        want = "sha256=" + hashlib.sha256(body).hexdigest()
        assert keys.body_digest([body], len(body)) == want
        assert keys.body_matches(want, body)
        assert not keys.body_matches(want, body + b"!")
