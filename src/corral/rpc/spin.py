"""A bounded, adaptive busy-poll before a blocking receive (the blocking client's reply).

A small call's reply comes back within tens of microseconds. Waiting for it in a blocking
``recv`` lets the client's CPU go idle, and waking an idle CPU costs tens of microseconds
more, most of all on a virtual machine (a halted vCPU). ``Spinner.recv`` first asks the
socket without waiting, again and again, for at most ``CORRAL_SPIN_US`` microseconds
(default ``DEFAULT_US``; ``0`` turns it off), and only then lets the caller block.

It adapts: a poll that ran out without a reply (a slow call, or the worker waiting for
this very CPU) makes the next polls skip, for a number of calls that doubles with each
miss (up to ``MAX_SKIP``); a reply caught while polling starts afresh. So a client whose
calls are slow, or that shares its CPU with the worker, spends almost nothing on it. What
it costs: up to ``CORRAL_SPIN_US`` of one CPU per blocking call that catches nothing, on
the calling thread only (never on the asyncio client's or the worker's paths).
"""

from __future__ import annotations

import _socket  # socket's C module: socket.py loads enum (a worker's start)
import os
from time import perf_counter

DEFAULT_US = 100
#: the most calls that skip polling after misses in a row
MAX_SKIP = 1024
_DONTWAIT = _socket.MSG_DONTWAIT


def bound_from_env() -> float:
    """``CORRAL_SPIN_US`` in seconds (0.0: off; at most 1 ms); ValueError, naming the
    variable, its value and the fix, for a value that is not a number."""
    raw = os.environ.get("CORRAL_SPIN_US", "")
    try:
        micros = float(raw) if raw else DEFAULT_US
    except ValueError:
        micros = float("nan")
    if micros != micros:
        raise ValueError(
            f"CORRAL_SPIN_US={raw!r} is not a number of microseconds: set it to a number "
            f"such as {DEFAULT_US} (the default), or 0 to turn the poll off"
        )
    return max(0.0, min(micros, 1000.0)) / 1e6


class Spinner:
    """One client's polling state (``skip``: calls left that do not poll; ``misses``:
    polls in a row that ran out)."""

    __slots__ = ("bound", "skip", "misses")

    def __init__(self, bound: float | None = None):
        self.bound = bound_from_env() if bound is None else bound
        self.skip = 0
        self.misses = 0

    def recv(self, sock: _socket.socket, size: int) -> bytes | None:
        """What ``sock`` has within the bound, without waiting for it; None where nothing
        came (the caller then receives as it would have)."""
        skip = self.skip
        if skip > 0:  # read once: threads sharing a Spinner race here, never below 0
            self.skip = skip - 1
            return None
        end = 0.0
        if sock.gettimeout() is None:  # a blocking socket: this call must not block
            recv, first, second = sock.recv, size, _DONTWAIT
        else:  # its descriptor is non-blocking, but ``sock.recv`` would wait (poll) first
            recv, first, second = os.read, sock.fileno(), size
        while True:
            try:
                chunk = recv(first, second)
            except BlockingIOError:
                now = perf_counter()
                if not end:
                    end = now + self.bound
                elif now >= end:
                    break
                continue
            self.misses = 0
            return chunk
        self.misses += 1
        self.skip = min(1 << self.misses, MAX_SKIP)
        return None
