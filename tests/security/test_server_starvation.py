"""Attack 2: slowloris (connections that never send a head each held a thread forever),
then fd exhaustion (EMFILE ended the accept loop: the worker never answered again)."""

from __future__ import annotations

import os
import resource
import socket
import time

import psutil
import pytest

from corral import Job
from corral.rpc.client import RPCClient
from corral.rpc.server import MAX_UNAUTHENTICATED


@pytest.fixture
def target(sched):
    (wid,) = sched.create_workers(Job(role="srv", replicas=1))
    worker = sched.get_workers("srv")[0]
    return sched, wid, worker


def _idle_connections(address: tuple[str, int], n: int, partial: bool) -> list[socket.socket]:
    socks = []
    for i in range(n):
        try:
            sock = socket.create_connection(address, timeout=5)
        except OSError:
            break
        if partial and i % 2:
            sock.sendall(b"POST /call HTTP/1.1\r\nHost: x\r\n")  # a head never finished
        socks.append(sock)
    return socks


def _fresh_health(sched, worker) -> str:
    client = RPCClient(sched.secret)  # a new connection, as a new controller call makes
    try:
        return client.request(worker.address, "/health", method="GET", timeout=60)["status"]
    finally:
        client.close()


def _closed_by_server(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def _held(socks: list[socket.socket], at_most: int) -> int:
    """How many of ``socks`` the server still holds, once it holds at most ``at_most``
    (polled: the server evicts as it accepts)."""
    deadline = time.monotonic() + 60
    while True:
        held = sum(not _closed_by_server(s) for s in socks)
        if held <= at_most or time.monotonic() > deadline:
            return held


def test_slowloris_connections_do_not_starve_the_controller(target) -> None:
    sched, wid, worker = target
    threads_before = psutil.Process(worker.pid).num_threads()
    socks = _idle_connections((worker.ip, worker.port), 300, partial=True)
    try:
        assert len(socks) == 300
        # the server keeps at most MAX_UNAUTHENTICATED of them, each for a bounded time
        assert _held(socks, MAX_UNAUTHENTICATED) <= MAX_UNAUTHENTICATED
        # bounded by the cap, not by the 300 connections; a little slack for threads the
        # backend itself starts meanwhile (a Ray actor process runs Ray's own threads)
        slack = 8
        threads = psutil.Process(worker.pid).num_threads()
        assert threads <= threads_before + MAX_UNAUTHENTICATED + slack, (threads, threads_before)
        assert _fresh_health(sched, worker) == "ok"
        assert sched.health(wid)["status"] == "ok"
    finally:
        for sock in socks:
            sock.close()
    assert _fresh_health(sched, worker) == "ok"


def test_fd_exhaustion_does_not_end_the_accept_loop(target) -> None:
    sched, wid, worker = target
    assert worker.pid
    in_use = len(os.listdir(f"/proc/{worker.pid}/fd"))
    old = resource.prlimit(worker.pid, resource.RLIMIT_NOFILE)
    resource.prlimit(worker.pid, resource.RLIMIT_NOFILE, (in_use + 8, old[1]))
    try:
        socks = _idle_connections((worker.ip, worker.port), 120, partial=False)
        try:
            # the worker is out of descriptors now; it must still answer its controller
            assert _fresh_health(sched, worker) == "ok"
        finally:
            for sock in socks:
                sock.close()
        # and after the attacker left
        assert _fresh_health(sched, worker) == "ok"
        assert sched.health(wid)["status"] == "ok"
    finally:
        resource.prlimit(worker.pid, resource.RLIMIT_NOFILE, old)
