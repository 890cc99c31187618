"""``rpc.peer_uid``: the kernel names the local user at the other end of a loopback
connection (the gate's per-user cap rests on it). In-process: a listening socket and a
client of this process, no other process."""

from __future__ import annotations

import os
import socket

import pytest

from corral.rpc.peer_uid import peer_uid


def _accepted(family: int, host: str) -> tuple[socket.socket, socket.socket, socket.socket]:
    server = socket.socket(family, socket.SOCK_STREAM)
    server.bind((host, 0))
    server.listen(1)
    client = socket.create_connection(server.getsockname()[:2])
    conn, _ = server.accept()
    return server, client, conn


@pytest.mark.parametrize(
    "family,host", [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")], ids=["v4", "v6"]
)
def test_the_owner_of_a_loopback_client_is_this_user(family, host):
    try:
        sockets = _accepted(family, host)
    except OSError as exc:  # no IPv6 loopback on this host
        if family == socket.AF_INET6:
            pytest.skip(f"no ::1 here: {exc}")
        raise
    try:
        assert peer_uid(sockets[2]) == os.getuid()
    finally:
        for s in sockets:
            s.close()


def test_a_connection_that_is_gone_has_no_owner():
    server, client, conn = _accepted(socket.AF_INET, "127.0.0.1")
    client.close()
    conn.close()
    server.close()
    assert peer_uid(conn) is None  # a closed socket: None, never an error
