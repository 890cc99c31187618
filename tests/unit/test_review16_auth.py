"""Review 16: a signature with a character above 0x7f (an HTTP head is read as latin-1, a
record comes from a shared store) is a wrong signature, never a TypeError from
``compare_digest`` (which refuses non-ASCII strings)."""

from __future__ import annotations

import pytest

from corral.auth import (
    RECORD_PREFIX,
    VERSION,
    RequestSigner,
    RequestVerifier,
    TrialKeys,
    open_record,
    sign_record,
)
from corral.errors import AuthenticationError
from corral.rpc.http import SocketReader
from tests.unit.test_rpc_server import runtime  # noqa: F401  (module fixture)

KEYS = TrialKeys("s" * 64)


def test_a_record_with_a_non_ascii_signature_is_unverified():
    assert open_record(KEYS, "key", sign_record(KEYS, "key", "value")) == "value"
    assert open_record(KEYS, "key", f"{RECORD_PREFIX}ab\u00e9 value") is None


def test_a_request_head_with_a_non_ascii_signature_is_refused():
    why, _nonce, _digest = RequestVerifier(KEYS).verify_head(
        f"{VERSION} n1 0 sha256=00 ab\u00e9", "POST", "/call", "", "", 0
    )
    assert why is not None and "wrong signature" in why


def test_a_reply_head_with_a_non_ascii_signature_is_an_authentication_error():
    with pytest.raises(AuthenticationError):
        RequestSigner(KEYS).verify_reply_head(
            "test", f"{VERSION} sha256=00 ab\u00e9", 200, "n1", "text/plain", 0
        )


def test_a_non_ascii_signature_is_refused_with_401_not_a_crash(runtime):  # noqa: F811
    """An unauthenticated peer's signature with a byte above 0x7f (heads are latin-1)
    made ``compare_digest`` raise TypeError in the connection's thread: no 401, a
    traceback per connection in the worker's log."""
    import socket

    from corral.auth import VERSION

    host, port = runtime.test_address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=20)
    auth = f"{VERSION} n1 0 sha256=00 ab\xe9".encode("latin-1")
    sock.sendall(
        b"POST /call HTTP/1.1\r\nx-corral-auth: " + auth + b"\r\nContent-Length: 0\r\n\r\n"
    )
    reader = SocketReader(sock)
    head = reader.read_head()
    sock.close()
    assert head is not None and head.status == 401, head
