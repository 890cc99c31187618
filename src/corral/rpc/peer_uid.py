"""Which local user owns the other end of a loopback TCP connection (``sock_diag``).

On 127.0.0.1 every local user has the same address, so a cap "per peer address" is one
cap for all of them: one user's flood would push out another's requests. The kernel knows
the owner of the client's socket; one ``NETLINK_SOCK_DIAG`` query (about 20 us) asks it
for exactly that socket. Linux only; None when the answer is not available.
"""

from __future__ import annotations

import _socket  # socket's C module: socket.py loads enum (a worker's start)
import struct

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST = 1
NLMSG_ERROR = 2
_NO_COOKIE = 0xFFFFFFFF
_ALL_STATES = 0xFFFFFFFF
_HEAD = struct.Struct("=IHHII")  # nlmsghdr
_REQ = struct.Struct("=BBBBI")  # inet_diag_req_v2 without its sockid
_SOCKID = struct.Struct(">HH16s16s")  # ports, addresses (network order); if/cookie follow
_MSG_UID = struct.Struct("=IIII")  # expires, rqueue, wqueue, uid (after family..sockid)


def _address(text: str, family: int) -> bytes:
    # inet_pton, not ipaddress: this module is on a worker's start path (issue 29)
    packed = _socket.inet_pton(family, text.partition("%")[0])
    return packed.ljust(16, b"\0") if family == _socket.AF_INET else packed


def peer_uid(conn: _socket.socket) -> int | None:
    """The uid owning the client end of ``conn`` (a connection this process accepted on
    a loopback address), or None."""
    try:
        family = conn.family
        local, peer = conn.getsockname(), conn.getpeername()
        sockid = _SOCKID.pack(
            peer[1], local[1], _address(peer[0], family), _address(local[0], family)
        ) + struct.pack("=III", 0, _NO_COOKIE, _NO_COOKIE)
        body = _REQ.pack(family, _socket.IPPROTO_TCP, 0, 0, _ALL_STATES) + sockid
        message = _HEAD.pack(_HEAD.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, 1, 0)
        nl = _socket.socket(_socket.AF_NETLINK, _socket.SOCK_DGRAM, NETLINK_SOCK_DIAG)
        try:
            nl.settimeout(0.5)
            nl.sendto(message + body, (0, 0))
            reply = nl.recv(8192)
        finally:
            nl.close()
    except (OSError, ValueError, IndexError):
        return None
    if len(reply) < _HEAD.size:
        return None
    _, kind, _, _, _ = _HEAD.unpack_from(reply)
    offset = _HEAD.size + 4 + _SOCKID.size + 12  # family/state/timer/retrans, sockid
    if kind != SOCK_DIAG_BY_FAMILY or len(reply) < offset + _MSG_UID.size:
        return None
    return _MSG_UID.unpack_from(reply, offset)[3]
