"""Attack 7: a reply declaring 1 TiB gave a bare MemoryError, and 4 GiB was allocated
before any byte arrived. Now a reply head is authenticated before its body is read, and a
declared length over the client's ``max_reply`` raises ProtocolError."""

from __future__ import annotations

import asyncio
import socket

import pytest

from corral.auth import AUTH_HEADER, TrialKeys, _reply_fields
from corral.errors import AuthenticationError, ProtocolError
from corral.rpc.client import AsyncRPCClient, RPCClient
from corral.rpc.http import SocketReader
from tests.support.loopback import LoopbackServer

SECRET = "d" * 64
TIB = 1 << 40


class HugeReplyServer(LoopbackServer):
    """Answers every request with a head announcing ``length`` bytes and never sends them;
    signed with the trial key (a worker gone wrong) or unsigned (an impostor)."""

    def __init__(self, length: int, signed: bool):
        self.length, self.signed = length, signed
        self.keys = TrialKeys(SECRET)
        super().__init__()

    def serve(self, conn: socket.socket) -> None:
        with conn:
            msg = SocketReader(conn).read_head()
            nonce = msg.headers["x-corral-auth"].split(" ")[1]
            headers = "Content-Type: application/x-corral-frame\r\n"
            if self.signed:
                digest = "gmac=" + "0" * 24 + "." + "0" * 32
                fields = _reply_fields(200, nonce, "application/x-corral-frame", self.length,
                                       digest)  # fmt: skip
                sig = self.keys.sign(self.keys.reply, fields)
                headers += f"{AUTH_HEADER}: v1 {digest} {sig}\r\n"
            conn.sendall(
                f"HTTP/1.1 200 OK\r\n{headers}Content-Length: {self.length}\r\n\r\n".encode()
            )
            try:
                conn.recv(1)
            except OSError:
                pass


@pytest.mark.parametrize("length", [TIB, 9 << 30])
def test_signed_reply_over_the_limit_is_a_protocol_error(length) -> None:
    server = HugeReplyServer(length, signed=True)
    sync_client, async_client = RPCClient(SECRET), AsyncRPCClient(SECRET)
    try:
        with pytest.raises(ProtocolError, match=f"{length} bytes, over the client's limit"):
            sync_client.request(server.address, "/call", {}, timeout=10)
        with pytest.raises(ProtocolError, match=f"{length} bytes, over the client's limit"):
            asyncio.run(async_client.request(server.address, "/call", {}, timeout=10))
    finally:
        sync_client.close()
        server.close()


def test_limit_is_configurable() -> None:
    server = HugeReplyServer(5 << 20, signed=True)
    client = RPCClient(SECRET, max_reply=1 << 20)
    try:
        with pytest.raises(ProtocolError, match="limit of 1048576"):
            client.request(server.address, "/call", {}, timeout=10)
    finally:
        client.close()
        server.close()


def test_unsigned_4_gib_reply_is_refused_before_allocating() -> None:
    """An impostor's huge head is refused on its signature, before any buffer exists
    (a 4 GiB allocation would have happened before; tracemalloc shows none)."""
    import tracemalloc

    server = HugeReplyServer(4 << 30, signed=False)
    client = RPCClient(SECRET)
    tracemalloc.start()
    try:
        with pytest.raises(AuthenticationError, match="did not prove"):
            client.request(server.address, "/call", {}, timeout=10)
        _current, peak = tracemalloc.get_traced_memory()
        assert peak < 64 << 20
    finally:
        tracemalloc.stop()
        client.close()
        server.close()
