"""review18: the engine thread's poll of a lent connection (noop4: Connection.serve_here
with rpc/spin.py) and work queued for the engine thread meanwhile."""

from __future__ import annotations

from types import SimpleNamespace

from corral.rpc import connection
from corral.rpc.connection import Connection


class _Dribble:
    """A poll that catches one small piece of a request each time (a request arriving in
    many segments, each within the bound of the last)."""

    bound = 1e-3

    def __init__(self, pieces: int):
        self.left = pieces
        self.calls = 0

    def recv(self, sock, size):
        self.calls += 1
        if not self.left:
            return None
        self.left -= 1
        return b"x"


def test_queued_work_is_asked_about_between_pieces_of_a_request(monkeypatch):
    dribble = _Dribble(pieces=200)
    monkeypatch.setattr(connection, "_SPINNER", dribble)
    conn = Connection.__new__(Connection)
    conn.reader = SimpleNamespace(pending=bytearray())
    conn.server = SimpleNamespace(stopping=False)
    conn.sock = SimpleNamespace(fileno=lambda: -1)
    conn.idle = 60.0
    conn.framed = False
    parks: list[int] = []

    def park(fd, timeout):  # work is queued for the engine thread: give the connection back
        parks.append(dribble.calls)
        return False

    given: list[dict] = []
    lease = SimpleNamespace(give_back=lambda **kw: given.append(kw))
    conn.serve_here(lease, park)
    assert given, "the connection was never given back"
    assert parks and parks[0] <= 2, (
        f"queued work was first asked about after {dribble.calls} polls "
        f"({200 - dribble.left} pieces taken, each up to the bound)"
    )
