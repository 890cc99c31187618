"""Clients for the worker RPC: a blocking one (here) and an asyncio one
(``rpc.async_client``), sharing the codec, signing and reply checks (``rpc.protocol``).

Connections are kept alive and reused per address. Every call carries a request id, so a
call retried after a dropped connection is answered from the worker's result cache instead
of running the method twice. A connection's text requests offer binary frames
(``rpc.frames``); once a verified reply frame has come back, its small requests go as
frames too (one MAC over head and body instead of a signed head and a body digest).
"""

from __future__ import annotations

import socket
import threading
from typing import Any

from corral.auth import RequestSigner, TrialKeys
from corral.errors import AuthenticationError, ProtocolError
from corral.rpc import frames, shm, spin, wire
from corral.rpc.async_client import AsyncRPCClient
from corral.rpc.http import Message, SocketReader, send_message, tune_socket
from corral.rpc.peers import SharedMemoryPeers
from corral.rpc.protocol import (
    CONNECT_TIMEOUT,
    MAX_CONNECTIONS_PER_ADDRESS,
    MAX_REPLY,
    SMALL_BODY,
    WorkerUnreachableError,
    _request_headers,
    check_reply_body,
    check_reply_head,
    interpret_reply,
    new_request_id,
    raise_remote,
    reply_value,
    sign_headers,
    split_address,
)

__all__ = [
    "CONNECT_TIMEOUT", "MAX_CONNECTIONS_PER_ADDRESS", "MAX_REPLY", "SMALL_BODY",
    "AsyncRPCClient", "RPCClient", "WorkerUnreachableError", "_request_headers",
    "check_reply_body", "check_reply_head", "interpret_reply", "new_request_id",
    "raise_remote", "sign_headers", "split_address",
]  # fmt: skip


_RECEIVE = 64 * 1024  # what one receive takes at most (a small reply whole)


class _Conn:
    offered = False  # has this connection carried the shared-memory offer yet?
    framed = False  # has a verified reply frame come back (the worker reads frames)?

    def __init__(self, address: str):
        host, port = split_address(address)
        self.sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT)
        tune_socket(self.sock)
        self.reader = SocketReader(self.sock)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class RPCClient:
    """Blocking client. Thread-safe: each thread takes its own pooled connection."""

    def __init__(self, secret: str, max_reply: int = MAX_REPLY):
        self._signer = RequestSigner(TrialKeys(secret))
        self.max_reply = max_reply
        self._idle: dict[str, list[_Conn]] = {}
        self._lock = threading.Lock()
        self.shm = SharedMemoryPeers()
        self.bytes_received = 0  # reply bytes, by socket or shared memory (benchmarks)
        self.spinner = spin.Spinner()  # a reply polled for briefly before ``recv`` waits

    def _take(self, address: str) -> tuple[_Conn, bool]:
        with self._lock:
            pool = self._idle.get(address)
            if pool:
                return pool.pop(), True
        return _Conn(address), False

    def _give_back(self, address: str, conn: _Conn) -> None:
        with self._lock:
            self._idle.setdefault(address, []).append(conn)

    def forget(self, address: str) -> None:
        """Close pooled connections to ``address`` (a worker that is gone)."""
        with self._lock:
            for conn in self._idle.pop(address, []):
                conn.close()

    def close(self) -> None:
        with self._lock:
            pools, self._idle = self._idle, {}
        for pool in pools.values():
            for conn in pool:
                conn.close()

    def request(
        self,
        address: str,
        path: str,
        payload: Any = None,
        *,
        method: str = "POST",
        timeout: float | None = None,
        request_id: str | None = None,
        identity: str | None = None,
    ) -> Any:
        """Send one request; return the decoded result or raise the remote error.

        ``identity`` (``worker_id#generation``) makes a worker refuse a request meant for
        an earlier or other worker at the same address.

        Raises TimeoutError at ``timeout`` and WorkerUnreachableError if the connection
        cannot be made or breaks (a reused connection is retried once on a fresh one).
        Large bodies to and from a worker on this host go through shared memory.
        """
        request_id = request_id or new_request_id()
        parts = wire.encode(payload) if method == "POST" else []
        headers: dict[str, str] = {}
        retried = False
        while True:
            with self._lock:  # ``_take``'s common case, inline
                pool = self._idle.get(address)
                conn = pool.pop() if pool else None
            reused = conn is not None
            try:
                if conn is None:
                    conn, reused = self._take(address)
            except TimeoutError:
                raise
            except OSError as exc:
                raise WorkerUnreachableError(address, exc) from None
            data = None
            if conn.framed and method == "POST":
                data = self._frame(address, path, request_id, identity, parts)
            if data is not None:
                data, nonce = data
            else:
                if not headers:
                    headers = _request_headers(request_id, identity)
                    headers[frames.OFFER_HEADER] = frames.OFFER
                send = self.shm.prepare(address, headers, parts, not conn.offered)
                conn.offered = True
                length = wire.frame_size(send) if send else 0
                nonce = sign_headers(
                    self._signer, headers, method, path, request_id, identity, send, length
                )
            try:
                if conn.sock.gettimeout() != timeout:  # settimeout is a system call
                    conn.sock.settimeout(timeout)
                if data is not None:
                    conn.sock.sendall(data)
                else:
                    send_message(conn.sock, f"{method} {path} HTTP/1.1", headers, send)
                reply, body = self._read_reply(conn, address, nonce, timeout)
            except TimeoutError:
                conn.close()
                raise TimeoutError(f"no reply from {address}{path} within {timeout}s") from None
            except OSError as exc:
                conn.close()
                if reused and not retried:
                    retried = True
                    continue
                raise WorkerUnreachableError(address, exc) from None
            except (AuthenticationError, ProtocolError):
                conn.close()
                raise
            if type(reply) is tuple:  # a verified reply frame: kept alive, no shared memory
                with self._lock:  # ``_give_back``
                    self._idle.setdefault(address, []).append(conn)
                return reply_value(address, *reply)
            if reply.keep_alive:
                self._give_back(address, conn)
            else:
                conn.close()
            if self.shm.refused(address, reply, body):
                continue
            return interpret_reply(address, reply)

    def _frame(
        self, address: str, path: str, request_id: str, identity: str | None, parts: list
    ) -> tuple[bytes, str] | None:
        """A signed request frame and its nonce, or None where a frame cannot carry the
        request (a large body, long fields, released segments to tell the worker about)."""
        size = len(parts[0]) + len(parts[1]) if len(parts) == 2 else wire.frame_size(parts)
        if size >= frames.MAX_BODY or not frames.head_fits(path, request_id, identity):
            return None
        pid = self.shm.local.get(address)
        if pid is not None and shm.has_released(pid):
            return None
        body = parts[0] + parts[1] if len(parts) == 2 else b"".join(parts)
        return frames.request_frame(self._signer, path, request_id, identity or "", body)

    def _read_reply(
        self, conn: _Conn, address: str, nonce: str, timeout: float | None
    ) -> tuple[Message | tuple[int, str, bytearray], memoryview | None]:
        """The verified reply, and its body when it came in a shared-memory segment: a
        text head and its body as a Message, a frame as ``frames.reply_fields``."""
        reader = conn.reader
        if not reader.pending:  # the socket's timeout is the request's (set above)
            spinner = self.spinner
            chunk = spinner.recv(conn.sock, _RECEIVE) if spinner.bound else None
            if chunk is None:
                chunk = conn.sock.recv(_RECEIVE)
            if not chunk:
                raise ConnectionResetError("worker closed the connection")
            reader.pending += chunk
        pending = reader.pending
        if pending[0] == frames.FRAME_BYTE:  # only sent to a client that offered frames
            size = frames.reply_size(pending) if len(pending) >= frames.HEAD_START else 0
            if size and len(pending) >= size:  # all here (a small reply): ``read_reply``'s
                frame = pending[:size]
                del pending[:size]
            else:
                frame = frames.read_reply(reader)
            fields = frames.reply_fields(self._signer.keys, address, frame, nonce)
            conn.framed = True
            self.bytes_received += len(fields[2])
            return fields, None
        reply = reader.read_head()
        if reply is None:
            raise ConnectionResetError("worker closed the connection")
        digest = check_reply_head(self._signer, address, reply, nonce, self.max_reply)
        body = self.shm.receive(address, reply)
        if body is None:
            reply.body = reader.read_body(reply.content_length)
            check_reply_body(self._signer, address, digest, reply.body)
            self.bytes_received += reply.content_length
        else:
            reply.body = body
            self.bytes_received += body.nbytes
        if shm.SEGMENT_HEADER in reply.headers:
            conn.sock.sendall(shm.ACK if body is not None else shm.NAK)
        return reply, body
