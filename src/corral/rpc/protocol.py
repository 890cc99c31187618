"""What both RPC clients share: request ids, request signing, reply checks and the
translation of a worker's error envelope back into corral's exceptions."""

from __future__ import annotations

import itertools
import json
import os
from typing import Any

from corral import errors
from corral.auth import AUTH_HEADER, RequestSigner
from corral.errors import AuthenticationError, ProtocolError
from corral.rpc import shm, wire
from corral.rpc.http import FRAME_TYPE, IDENTITY_HEADER, REQUEST_ID_HEADER, Message

CONNECT_TIMEOUT = 5.0
MAX_REPLY = 8 * 1024**3
#: Connections the async client keeps open to one worker (per event loop); more calls wait.
MAX_CONNECTIONS_PER_ADDRESS = 8
SMALL_BODY = 64 * 1024
_REMOTE_ERRORS = {
    name: getattr(errors, name)
    for name in (
        "EngineImportError", "EngineCreationError", "EngineCallError", "EngineNotFoundError",
        "WorkerNotFoundError", "ConfigError", "ProtocolError", "WorkerCreationError",
        "RefError", "RefLostError",
    )
}  # fmt: skip


class WorkerUnreachableError(ConnectionError):
    """The connection to a worker failed or broke; the worker may have died."""

    def __init__(self, address: str, cause: BaseException):
        self.address = address
        self.cause = cause
        super().__init__(f"worker at {address} is unreachable: {type(cause).__name__}: {cause}")


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


class _RequestIds:
    """Request ids: a random per-process prefix and a counter (unique without uuid4's
    cost per call); a forked child picks a new prefix."""

    def __init__(self) -> None:
        self.reset()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self.reset)

    def reset(self) -> None:
        self.prefix = os.urandom(8).hex()
        self.counter = itertools.count(1)

    def next(self) -> str:
        return f"{self.prefix}{next(self.counter):08x}"


_ids = _RequestIds()


#: ``new_request_id()``: an id no other request of any process will carry (the worker caches
#: by it). The counter's own method: a layer less on every call.
new_request_id = _ids.next


_STATIC_HEAD = f"Host: corral\r\nContent-Type: {FRAME_TYPE}\r\n"


def raise_remote(error: dict) -> None:
    """Turn an error envelope from a worker back into the matching corral exception."""
    kind = error.get("type", "")
    message = error.get("message", "remote error")
    tb = error.get("traceback", "")
    cls = _REMOTE_ERRORS.get(kind)
    if cls is errors.EngineCallError:
        raise errors.EngineCallError(message, remote_traceback=tb)
    if cls is errors.ConfigError:
        raise errors.SchedulerError(message)
    if cls is errors.RefLostError:
        raise errors.RefLostError(message, str(error.get("owner", "")))
    if cls is not None:
        raise cls(message + (f"\n--- remote traceback ---\n{tb}" if tb else ""))
    raise errors.EngineCallError(f"{kind}: {message}", remote_traceback=tb)


#: what most calls return (``rpc.envelope.OK_NONE``; the client does not import the server side)
_OK_NONE = b"".join(wire.encode({"ok": True, "result": None}))


def interpret_reply(address: str, msg: Message) -> Any:
    return reply_value(address, msg.status, msg.headers.get("content-type"), msg.body)


def reply_value(address: str, status: int, content_type: str | None, body) -> Any:
    """A reply's result, or the remote error raised (``interpret_reply`` of its parts)."""
    if body == _OK_NONE and status == 200 and content_type == FRAME_TYPE:
        return None
    if status == 409:
        text = bytes(body[:300]).decode("utf-8", "replace")
        raise WorkerUnreachableError(address, ConnectionRefusedError(text))
    if content_type != FRAME_TYPE:
        text = bytes(body[:500]).decode("utf-8", "replace")
        if status == 200:
            return json.loads(text) if text else None
        raise ProtocolError(f"worker at {address} answered {status}: {text}")
    envelope = wire.decode(body)
    if not isinstance(envelope, dict) or "ok" not in envelope:
        raise ProtocolError(f"worker at {address} sent a reply without an envelope")
    if not envelope["ok"]:
        raise_remote(envelope.get("error") or {})
    return envelope.get("result")


def _request_headers(request_id: str, identity: str | None = None) -> dict[str, str]:
    headers = {"Host": "corral", REQUEST_ID_HEADER: request_id, "Content-Type": FRAME_TYPE}
    if identity:
        headers[IDENTITY_HEADER] = identity
    return headers


def sign_headers(
    signer: RequestSigner, headers: dict[str, str], method: str, path: str, request_id: str,
    identity: str | None, parts: list, length: int,
) -> str:  # fmt: skip
    """Add the signature (after the shared-memory headers are set); the reply's nonce."""
    auth, nonce = signer.sign(
        method, path, request_id, identity or "", parts, length, shm.signed_headers(headers),
    )  # fmt: skip
    headers[AUTH_HEADER] = auth
    return nonce


def check_reply_head(
    signer: RequestSigner, address: str, msg: Message, nonce: str, max_reply: int
) -> str:
    """Refuse a reply head before its body is read: a 401, a head not signed by the
    trial's worker, or a body over ``max_reply``. Returns the body digest to check."""
    if msg.status == 401:
        raise AuthenticationError(
            f"worker at {address} refused the request (401): the trial secret is missing or "
            "wrong; connect with the scheduler that started the worker"
        )
    length = msg.content_length
    digest = signer.verify_reply_head(
        address,
        msg.headers.get(AUTH_HEADER),
        msg.status,
        nonce,
        msg.headers.get("content-type", ""),
        length,
        shm.signed_headers(msg.headers),
    )
    if length > max_reply:
        raise ProtocolError(
            f"worker at {address} announced a reply of {length} bytes, over the client's limit "
            f"of {max_reply}; raise max_reply if such replies are expected"
        )
    return digest


def check_reply_body(signer: RequestSigner, address: str, digest: str, body) -> None:
    if not signer.keys.body_matches(digest, body):
        raise AuthenticationError(
            f"the reply body from {address} does not match its signed digest: it was altered "
            "on the way"
        )
