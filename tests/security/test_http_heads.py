"""What a connection must send before the worker's server holds it, and what a head may
contain (issue 25, attacks 6 and 7).

Before: ``ACK``/``NAK`` lines were taken before any signature check and each counted as a
complete head, so a connection sending one every 5 s outlived the 10 s head timeout for
ever; and ``parse_head`` split lines on CRLF only, so a bare LF could sit inside a header
value although ``shm.signed_headers`` relies on values holding no line break.
"""

from __future__ import annotations

import socket
import time

import pytest

from corral import Job
from corral.errors import ProtocolError
from corral.rpc.http import parse_head
from corral.rpc.server import HEAD_TIMEOUT


@pytest.fixture
def worker(local_backend):
    sched = local_backend.scheduler()
    sched.create_workers(Job(role="srv", replicas=1))
    yield sched.get_workers("srv")[0]
    sched.close()


def _closed(sock: socket.socket, within: float) -> tuple[bool, bytes]:
    """Did the server close ``sock`` within ``within`` seconds (and what did it say)?"""
    sock.settimeout(within)
    got = b""
    try:
        while True:
            chunk = sock.recv(4096)
            if not chunk:
                return True, got
            got += chunk
    except TimeoutError:
        return False, got
    except OSError:
        return True, got


def test_ack_lines_before_a_signed_request_do_not_hold_a_connection(worker) -> None:
    with socket.create_connection((worker.ip, worker.port), timeout=5) as sock:
        start = time.monotonic()
        for method in ("ACK", "NAK"):
            sock.sendall(f"{method} 1\r\nx-corral-request-id: 1\r\n\r\n".encode())
        closed, said = _closed(sock, 5.0)
        assert closed, "an unauthenticated ACK was taken as a request"
        assert said.startswith(b"HTTP/1.1 401")
        assert time.monotonic() - start < 5.0


def test_acks_every_few_seconds_do_not_outlive_the_head_timeout(worker) -> None:
    """The issue's attack: a complete ACK head every 3 s (each used to count as a head)."""
    with socket.create_connection((worker.ip, worker.port), timeout=5) as sock:
        start = time.monotonic()
        closed = False
        while time.monotonic() - start < HEAD_TIMEOUT + 10 and not closed:
            try:
                sock.sendall(b"ACK 1\r\nx-corral-request-id: 1\r\n\r\n")
            except OSError:
                closed = True
                break
            closed, _ = _closed(sock, 3.0)
        assert closed
        assert time.monotonic() - start < HEAD_TIMEOUT + 6


@pytest.mark.parametrize(
    "head",
    [
        b"POST /call HTTP/1.1\r\nx-corral-shm-offer: a\nx-corral-shm-segment: 1 2 3 4",
        b"POST /call HTTP/1.1\r\nx-a: b\rx-corral-shm-local: 1",
        b"POST /call HTTP/1.1\nx-corral-auth: v1 forged",
    ],
)
def test_a_bare_lf_or_cr_in_a_head_is_refused(head: bytes) -> None:
    with pytest.raises(ProtocolError, match="bare LF or CR"):
        parse_head(head)


def test_a_bare_lf_in_a_header_value_gets_400_from_a_worker(worker) -> None:
    with socket.create_connection((worker.ip, worker.port), timeout=5) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nx-a: b\nx-corral-shm-local: 1\r\n\r\n")
        closed, said = _closed(sock, 5.0)
    assert closed and said.startswith(b"HTTP/1.1 400"), said
