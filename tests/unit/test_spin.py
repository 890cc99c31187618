"""The blocking client's bounded, adaptive poll for a reply (``rpc.spin``): it never waits
past its bound (nor on a socket with a timeout), backs off after misses, starts afresh
after a hit, is off with ``CORRAL_SPIN_US=0``, and a reply it catches is checked as any."""

from __future__ import annotations

import socket
import time

import pytest

from corral.rpc import connection, spin
from corral.rpc.client import RPCClient
from tests.unit.test_blocking_frames import _call
from tests.unit.test_rpc_server import SECRET, runtime  # noqa: F401  (module fixture)


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


@pytest.mark.parametrize("timeout", [None, 5.0])
def test_a_poll_takes_what_is_there_and_never_waits_past_its_bound(pair, timeout):
    a, b = pair
    a.settimeout(timeout)  # with a timeout, ``sock.recv`` would wait for data first
    spinner = spin.Spinner(0.001)
    b.sendall(b"reply")
    assert spinner.recv(a, 100) == b"reply"
    started = time.monotonic()
    assert spinner.recv(a, 100) is None
    assert time.monotonic() - started < 1.0
    assert a.gettimeout() == timeout


def test_misses_back_off_and_a_hit_starts_afresh(pair):
    a, b = pair
    spinner = spin.Spinner(0.0001)
    assert spinner.recv(a, 100) is None
    assert (spinner.misses, spinner.skip) == (1, 2)
    b.sendall(b"x")
    assert spinner.recv(a, 100) is None and spinner.recv(a, 100) is None  # skipped
    assert spinner.recv(a, 100) == b"x"  # the skip is spent: it polls, and catches it
    assert spinner.misses == 0
    for _ in range(20):  # misses in a row: the skip doubles, up to MAX_SKIP
        spinner.skip = 0
        spinner.recv(a, 100)
    assert spinner.skip == spin.MAX_SKIP


def test_the_bound_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("CORRAL_SPIN_US", "0")
    assert spin.bound_from_env() == 0.0
    assert RPCClient(SECRET).spinner.bound == 0.0
    monkeypatch.setenv("CORRAL_SPIN_US", "30")
    assert spin.bound_from_env() == pytest.approx(30e-6)
    monkeypatch.delenv("CORRAL_SPIN_US")
    assert spin.bound_from_env() == spin.DEFAULT_US / 1e6


@pytest.mark.parametrize("value", ["junk", "nan", "1e"])
def test_a_bound_that_is_not_a_number_is_refused_naming_the_variable_and_the_fix(
    monkeypatch, value
):
    monkeypatch.setenv("CORRAL_SPIN_US", value)
    with pytest.raises(ValueError, match=f"CORRAL_SPIN_US='{value}'.*0 to turn the poll off"):
        spin.bound_from_env()
    with pytest.raises(ValueError, match="CORRAL_SPIN_US"):
        RPCClient(SECRET)


def test_replies_the_poll_catches_are_the_calls_own(runtime, monkeypatch):  # noqa: F811
    caught = []
    recv = spin.Spinner.recv

    def counting(self, sock, size):
        chunk = recv(self, sock, size)
        caught.append(chunk is not None)
        return chunk

    monkeypatch.setattr(spin.Spinner, "recv", counting)
    client = RPCClient(SECRET)
    client.spinner = spin.Spinner(0.05)  # long enough to catch every reply here
    try:
        results = [client.request(runtime.test_address, "/call", _call("noop")) for _ in range(6)]
    finally:
        client.close()
    assert results == [None] * 6
    assert any(caught), "the client never caught a reply by polling"


def test_the_engine_thread_polls_a_lent_connection_before_it_parks(runtime, monkeypatch):  # noqa: F811
    caught = []

    class Counting(spin.Spinner):
        def recv(self, sock, size):
            chunk = super().recv(sock, size)
            caught.append(chunk)
            return chunk

    monkeypatch.setattr(connection, "_SPINNER", Counting(0.05))
    client = RPCClient(SECRET)
    client.spinner = spin.Spinner(0.0)
    try:
        for _ in range(6):
            assert client.request(runtime.test_address, "/call", _call("thread_name"))
    finally:
        client.close()
    assert any(caught), "the engine thread never caught a lent connection's next request"
