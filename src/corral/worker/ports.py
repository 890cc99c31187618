"""Ports for a worker's engines: picked by the kernel on this host, then released for
the engines to bind (AReaL's ``worker_ports`` after the RPC port)."""

from __future__ import annotations

import _socket  # socket's C module: socket.py loads enum (a worker's start)


def reserve_ports(count: int) -> list[int]:
    """Ports picked by the kernel on this host, released for the engines to bind."""
    socks = []
    try:
        for _ in range(count):
            sock = _socket.socket()  # AF_INET, SOCK_STREAM, as socket.socket()
            sock.bind(("", 0))
            socks.append(sock)
        return [s.getsockname()[1] for s in socks]
    finally:
        for sock in socks:
            sock.close()
