"""The trial secret as keys: signed requests and replies, a replay guard, signed records.

The secret itself never leaves the processes that hold it. Six keys are derived from it
(HMAC-SHA256 of a label), one per use, so a signature made for one use is worthless for
another (a reply signature cannot be replayed as a request, a record signature cannot
sign a request):

* ``request``: the controller signs each request head: method, path, request id, target
  worker identity, body length, body digest, nonce, timestamp and the shared-memory
  headers (a body in a same-host segment is named by a signed descriptor).
* ``reply``: the worker signs each reply head: status, the request's nonce (binding the
  reply to that request), content type, body length and body digest. A peer that does not
  hold the secret cannot produce a reply the client accepts: mutual authentication.
* ``body``: the body digest. Bodies under ``LARGE_BODY`` use SHA-256 (covered by the head
  signature); larger ones use AES-256-GMAC with a fresh random IV (the ``cryptography``
  package, imported only then), which is several times faster than SHA-256 per byte.
* ``record``: name-resolve records (a worker's address) are signed by the worker.
* ``frame-request`` / ``frame-reply``: the binary frame of a pipelined connection
  (``rpc.frames``): one MAC over the whole frame, head and body.

Nonces are ``<client id>-<counter>``: each client object takes a random 64-bit id and
counts. A server remembers, per client id, the highest counter and the counters seen in a
sliding window below it, so memory stays bounded however many requests are made.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Iterable

from corral.errors import AuthenticationError

AUTH_HEADER = "x-corral-auth"
VERSION = "v1"
LARGE_BODY = 1 << 20
MAX_SKEW = 120.0
REPLAY_WINDOW = 1 << 16
#: bodies up to this size have their digest remembered (see TrialKeys.body_matches)
_MEMO_BYTES = 4096
_GCM_IV = 12


try:  # OpenSSL's functions, the very ones hashlib and hmac hand out (``hashlib.sha256`` is
    # ``openssl_sha256``, ``hmac.compare_digest`` is this one), without those two modules'
    # import (~1 ms of a worker's start: hashlib's table of algorithms with _blake2, hmac's
    # warnings); and OpenSSL's HMAC object: copy, update and hexdigest in C
    from _hashlib import compare_digest
    from _hashlib import hmac_digest as _openssl_hmac_digest
    from _hashlib import hmac_new as _openssl_hmac
    from _hashlib import openssl_sha256 as sha256
except ImportError:  # a Python built without OpenSSL
    from hashlib import sha256
    from hmac import compare_digest

    _openssl_hmac = _openssl_hmac_digest = None


def _keyed_hmac(key: bytes):
    """An HMAC-SHA256 object keyed once, to copy per message. OpenSSL's own object when
    there is one: ``hmac.HMAC.copy`` wraps it in Python, about half the cost of signing a
    small head (issue 29)."""
    if _openssl_hmac is not None:
        try:
            return _openssl_hmac(key, digestmod="sha256")
        except ValueError:  # OpenSSL refused the digest: the portable object below
            pass
    import hmac

    return hmac.new(key, digestmod=sha256)


def hmac_sha256(key: bytes, message: bytes) -> bytes:
    """``hmac.digest(key, message, "sha256")``: OpenSSL's one-shot HMAC where there is
    one, else the hmac module's."""
    if _openssl_hmac_digest is not None:
        try:
            return _openssl_hmac_digest(key, message, "sha256")
        except ValueError:  # OpenSSL refused the digest: the portable HMAC below
            pass
    import hmac

    return hmac.digest(key, message, sha256)


def _derive(secret: bytes, label: bytes) -> bytes:
    return hmac_sha256(secret, b"corral/" + label)


class TrialKeys:
    """Keys derived from one trial secret; holds no copy of the secret itself."""

    def __init__(self, secret: str):
        if not isinstance(secret, str) or not secret:
            raise AuthenticationError("the trial secret is missing")
        raw = secret.encode()
        self.request = _derive(raw, b"request")
        self.reply = _derive(raw, b"reply")
        self.body = _derive(raw, b"body")
        self.record = _derive(raw, b"record")
        # the binary frame of a pipelined connection (``rpc.frames``): one MAC over head
        # and body, its own keys so that no text-head signature is valid there or back
        self.frame_request = _derive(raw, b"frame-request")
        self.frame_reply = _derive(raw, b"frame-reply")
        self._aes = None
        # Most replies share one body (``{"ok": true, "result": null}``): the last small
        # one-part body digested (held, and bytes are immutable, so ``is`` cannot match
        # another body) and the last small body that matched its digest (a byte-for-byte
        # equal body under the same digest matches without hashing it again).
        self._signed: tuple[object, str] = (None, "")
        self._matched: tuple[bytes, str] = (b"", "")
        # HMAC objects keyed once: ``sign`` copies one instead of re-keying per message
        # (the key schedule is half the cost of signing a small head)
        self._keyed = {
            key: _keyed_hmac(key)
            for key in (self.request, self.reply, self.record, self.frame_request, self.frame_reply)
        }

    def _gmac(self, iv: bytes, parts: Iterable) -> bytes:
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

        enc = Cipher(algorithms.AES(self.body), modes.GCM(iv)).encryptor()
        for part in parts:
            enc.authenticate_additional_data(part)
        enc.finalize()
        return enc.tag

    def body_digest(self, parts: list, length: int) -> str:
        """The digest a head carries for a body made of ``parts`` (``length`` bytes)."""
        if length < LARGE_BODY:
            single = parts[0] if len(parts) == 1 and type(parts[0]) is bytes else None
            if single is not None and length <= _MEMO_BYTES:
                signed = self._signed  # the last small one-part body digested, by identity
                if signed[0] is single:
                    return signed[1]
                digest = "sha256=" + sha256(single).hexdigest()
                self._signed = (single, digest)
                return digest
            h = sha256()
            for part in parts:
                h.update(part)
            return "sha256=" + h.hexdigest()
        iv = os.urandom(_GCM_IV)
        return f"gmac={iv.hex()}.{self._gmac(iv, parts).hex()}"

    def body_matches(self, digest: str, body) -> bool:
        """True if ``body`` is the body ``digest`` (from a verified head) was made for."""
        length = len(body) if not isinstance(body, memoryview) else body.nbytes
        if length < LARGE_BODY:
            if length <= _MEMO_BYTES:
                seen = self._matched  # the last small body that matched, and its digest
                if seen[1] == digest and seen[0] == body:
                    return True
            want = "sha256=" + sha256(body).hexdigest()
            if not compare_digest(digest, want):
                return False
            if length <= _MEMO_BYTES:
                self._matched = (bytes(body), digest)
            return True
        algo, _, value = digest.partition("=")
        iv_hex, _, tag_hex = value.partition(".")
        try:
            iv, tag = bytes.fromhex(iv_hex), bytes.fromhex(tag_hex)
        except ValueError:
            return False
        if algo != "gmac" or len(iv) != _GCM_IV or len(tag) != 16:
            return False
        return compare_digest(self._gmac(iv, [body]), tag)

    def mac(self, key: bytes, *chunks) -> bytes:
        """HMAC-SHA256 under ``key`` (one of this object's) of the chunks, concatenated."""
        mac = self._keyed[key].copy()
        for chunk in chunks:
            mac.update(chunk)
        return mac.digest()

    def sign(self, key: bytes, fields: Iterable[str]) -> str:
        """Hex HMAC-SHA256 of the fields, one per line, under ``key``."""
        keyed = self._keyed.get(key)
        if keyed is None:
            return hmac_sha256(key, "\n".join(fields).encode("utf-8")).hex()
        mac = keyed.copy()
        mac.update("\n".join(fields).encode("utf-8"))
        return mac.hexdigest()


def _request_fields(
    method: str, path: str, request_id: str, identity: str, length: int, nonce: str, ts: str,
    digest: str, segment: str = "",
) -> list[str]:  # fmt: skip
    return ["corral-request", VERSION, method, path, request_id, identity, str(length), nonce,
            ts, digest, segment]  # fmt: skip


def _reply_fields(
    status: int, nonce: str, content_type: str, length: int, digest: str, segment: str = ""
) -> list:
    """``segment``: the message's shared-memory headers (``shm.signed_headers``: the
    descriptor of a body sent that way, the offer, released segments), signed so that none
    can be swapped, added or dropped on the way."""
    return ["corral-reply", VERSION, str(status), nonce, content_type, str(length), digest,
            segment]  # fmt: skip


class RequestSigner:
    """The client side: one random id per client object, a counter per request."""

    def __init__(self, keys: TrialKeys):
        self.keys = keys
        self.client_id = os.urandom(8).hex()
        self._counter = itertools.count(1)

    def next_nonce(self) -> str:
        """A nonce no request of this client carried before: ``<client id>-<counter>``."""
        return f"{self.client_id}-{next(self._counter)}"

    def sign(
        self, method: str, path: str, request_id: str, identity: str, parts: list, length: int,
        segment: str = "",
    ) -> tuple[str, str]:  # fmt: skip
        """(header value, nonce) for one request."""
        nonce = self.next_nonce()
        ts = f"{time.time():.3f}"
        digest = self.keys.body_digest(parts, length)
        fields = _request_fields(
            method, path, request_id, identity, length, nonce, ts, digest, segment
        )
        sig = self.keys.sign(self.keys.request, fields)
        return f"{VERSION} {nonce} {ts} {digest} {sig}", nonce

    def verify_reply_head(
        self, address: str, header: str | None, status: int, nonce: str, content_type: str,
        length: int, segment: str = "",
    ) -> str:  # fmt: skip
        """The reply's body digest, once the head is proven to come from the trial's worker.
        Raises AuthenticationError otherwise."""
        parts = (header or "").split(" ")
        if len(parts) == 3 and parts[0] == VERSION:
            digest, sig = parts[1], parts[2]
            fields = _reply_fields(status, nonce, content_type, length, digest, segment)
            # isascii: compare_digest raises TypeError for a str with other characters
            if sig.isascii() and compare_digest(self.keys.sign(self.keys.reply, fields), sig):
                return digest
        raise AuthenticationError(
            f"the peer at {address} did not prove that it holds the trial secret (its reply "
            f"{'is unsigned' if not header else 'has a wrong signature'}): it is not this "
            "trial's worker, or the reply was altered on the way. Nothing was sent that it "
            "could reuse; check where name-resolve points (docs/security.md)"
        )


def sign_request_head(
    secret: str, method: str, path: str, body: bytes = b"", *, length: int | None = None,
    request_id: str = "", identity: str = "",
) -> str:  # fmt: skip
    """An ``x-corral-auth`` value for a hand-made request (tests, tools). ``length`` may
    differ from ``len(body)`` to sign a head whose body is never sent."""
    signer = RequestSigner(TrialKeys(secret))
    size = len(body) if length is None else length
    return signer.sign(method, path, request_id, identity, [body], size)[0]


class ReplayGuard:
    """Refuses a nonce seen before and timestamps more than ``max_skew`` seconds off.

    Only called for requests whose signature is valid, so only holders of the secret can
    add entries. Per client id: the highest counter and the counters seen within
    ``window`` below it; a client silent for longer than twice the skew is forgotten (any
    replay of its requests has a stale timestamp by then)."""

    def __init__(self, max_skew: float = MAX_SKEW, window: int = REPLAY_WINDOW):
        self.max_skew = max_skew
        self.window = window
        self._clients: dict[str, list] = {}  # id -> [high, seen set, last seen]
        self._lock = threading.Lock()
        self._next_sweep = 0.0

    def check(self, nonce: str, ts: str) -> str | None:
        """None if fresh (and now remembered); else why it is refused."""
        now = time.time()
        try:
            when = float(ts)
        except ValueError:
            return "bad timestamp"
        if not abs(now - when) <= self.max_skew:
            return (
                f"timestamp {ts} is {now - when:+.0f}s off this host's clock (limit "
                f"{self.max_skew:g}s): a stale or replayed request, or clocks out of sync"
            )
        client, _, count_text = nonce.rpartition("-")
        if not client or not count_text.isdigit() or len(count_text) > 19:
            return "bad nonce"
        count = int(count_text)
        with self._lock:
            if now >= self._next_sweep:
                limit = now - 2 * self.max_skew
                self._clients = {k: v for k, v in self._clients.items() if v[2] >= limit}
                self._next_sweep = now + self.max_skew
            state = self._clients.get(client)
            if state is None:
                state = self._clients[client] = [0, set(), now]
            high, seen = state[0], state[1]
            if count <= high - self.window or count in seen:
                return "nonce seen before: a replayed request"
            seen.add(count)
            state[2] = now
            if count > high:
                state[0] = count
                if len(seen) > self.window + 4096:
                    state[1] = {c for c in seen if c > count - self.window}
        return None


class RequestVerifier:
    """The server side of request signatures."""

    def __init__(self, keys: TrialKeys, guard: ReplayGuard | None = None):
        self.keys = keys
        self.guard = guard or ReplayGuard()

    def verify_head(
        self, header: str | None, method: str, path: str, request_id: str, identity: str,
        length: int, segment: str = "",
    ) -> tuple[str | None, str, str]:  # fmt: skip
        """(why refused or None, nonce, body digest)."""
        parts = (header or "").split(" ")
        if len(parts) != 5 or parts[0] != VERSION:
            return "unsigned request", "", ""
        _v, nonce, ts, digest, sig = parts
        fields = _request_fields(
            method, path, request_id, identity, length, nonce, ts, digest, segment
        )
        # isascii: compare_digest raises TypeError for a str with other characters (a
        # head is latin-1: any byte of an unauthenticated peer's)
        if not (sig.isascii() and compare_digest(self.keys.sign(self.keys.request, fields), sig)):
            return "wrong signature (another trial's secret, or an altered request)", "", ""
        why = self.guard.check(nonce, ts)
        return why, nonce, digest

    def sign_reply(
        self, status: int, nonce: str, content_type: str, parts: list, segment: str = ""
    ) -> str:
        length = _total_bytes(parts)
        digest = self.keys.body_digest(parts, length)
        fields = _reply_fields(status, nonce, content_type, length, digest, segment)
        sig = self.keys.sign(self.keys.reply, fields)
        return f"{VERSION} {digest} {sig}"


def _total_bytes(parts: list) -> int:
    """Bytes in a frame's parts (``rpc.wire.frame_size``, which this module, below rpc,
    does not import)."""
    total = 0
    for p in parts:
        total += p.nbytes if type(p) is memoryview else len(p)
    return total


# ------------------------------------------------------------------ records
RECORD_PREFIX = "corral-signed-v1 "


def sign_record(keys: TrialKeys, key: str, value: str) -> str:
    """``value`` stored under ``key``, with a signature binding both."""
    return f"{RECORD_PREFIX}{keys.sign(keys.record, ['record', key, value])} {value}"


def open_record(keys: TrialKeys, key: str, stored: str) -> str | None:
    """The value if ``stored`` was signed with this trial's key for ``key``, else None."""
    if not stored.startswith(RECORD_PREFIX):
        return None
    sig, _, value = stored[len(RECORD_PREFIX) :].partition(" ")
    # isascii: compare_digest raises TypeError for a str with other characters
    if sig.isascii() and compare_digest(keys.sign(keys.record, ["record", key, value]), sig):
        return value
    return None


def unverified_value(stored: str) -> str:
    """A record's value without checking its signature (for display only)."""
    if stored.startswith(RECORD_PREFIX):
        return stored[len(RECORD_PREFIX) :].partition(" ")[2]
    return stored
