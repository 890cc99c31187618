"""Per-role engine-call statistics, recorded in the controller's call path.

The hook is two calls per engine call: ``begin(role)`` (one deque append and a clock
read) and ``end(role, started, ok)`` (a clock read and one deque append); no lock.
Everything else — rates, percentiles, history — is computed once a second by
``sample()`` on the publisher's thread, off the call path.

Clock reads are the hook's largest cost (on a VM without a usable vDSO clock, each is a
system call: several times a plain function call), so a *busy* role (at least
``BUSY_RATE`` calls/s in the last window) has its latency timed on one call in
``TIMED_STRIDE`` only: its p50/p99 come from thousands of timed calls a second all the
same, while every call is still counted (rate, errors, in flight). A quieter role has
every call timed.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque

HISTORY_POINTS = 300  # seconds of per-role history kept (and published)
BUSY_RATE = 1000.0  # calls/s from which a role's latencies are timed on a stride
TIMED_STRIDE = 8  # a busy role has one call in this many timed
_clock = time.perf_counter


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list (0.0 when empty)."""
    if not sorted_values:
        return 0.0
    rank = min(len(sorted_values), max(1, math.ceil(q / 100 * len(sorted_values))))
    return sorted_values[rank - 1]


class RoleCalls:
    """Running totals and the per-second history of one role."""

    def __init__(self) -> None:
        self.total = 0
        self.errors = 0
        self.rate = 0.0
        self.p50 = 0.0
        self.p99 = 0.0
        # (unix time, calls/s, p50 ms, p99 ms); the latencies are None in a second without calls
        self.history: deque[tuple] = deque(maxlen=HISTORY_POINTS)

    def as_dict(self, in_flight: int) -> dict:
        return {
            "total": self.total,
            "errors": self.errors,
            "in_flight": in_flight,
            "rate": round(self.rate, 3),
            "p50_ms": round(self.p50 * 1e3, 4),
            "p99_ms": round(self.p99 * 1e3, 4),
            "history": [list(point) for point in self.history],
        }


class CallStats:
    """Counts, rates, p50/p99 latency and calls in flight, per role."""

    enabled = True

    def __init__(self) -> None:
        # deque.append and popleft are atomic: callers on any thread or event loop never
        # wait for a lock, and the sampler drains exactly what was appended.
        self._begun: deque[str] = deque()
        self._ended: deque[tuple[str, float, bool]] = deque()
        self._in_flight: dict[str, int] = {}
        self._roles: dict[str, RoleCalls] = {}
        self._last_sample = time.monotonic()
        self._sampling = threading.Lock()
        self._note_begun = self._begun.append  # bound once: the hook runs on every call
        self._note_ended = self._ended.append
        self._busy: frozenset[str] = frozenset()  # roles timed on a stride (set by sample)
        self._turn = 0

    # ------------------------------------------------------------ the hook
    def begin(self, role: str) -> float | None:
        """Count a call in flight; its start time, or None for a busy role's untimed call."""
        self._note_begun(role)
        if role in self._busy:
            self._turn = turn = self._turn + 1  # unlocked: a lost step only moves the stride
            if turn % TIMED_STRIDE:
                return None
        return _clock()

    def end(self, role: str, started: float | None, ok: bool = True) -> None:
        self._note_ended((role, None if started is None else _clock() - started, ok))

    # ------------------------------------------------------------ sampling
    def sample(self, now: float | None = None) -> dict[str, dict]:
        """Close the current window: update totals, rates and percentiles; return the
        per-role figures (``RoleCalls.as_dict``), history included."""
        with self._sampling:
            return self._sample(time.monotonic() if now is None else now)

    def _sample(self, now: float) -> dict[str, dict]:
        window = _drain(self._ended)  # ended first: a call drained here has begun below
        for role in _drain(self._begun):
            self._in_flight[role] = self._in_flight.get(role, 0) + 1
        for role, _elapsed, _ok in window:
            self._in_flight[role] -= 1
        in_flight = self._in_flight
        span = max(now - self._last_sample, 1e-3)
        self._last_sample = now
        by_role: dict[str, list[float]] = {}
        counts: dict[str, int] = {}
        errors: dict[str, int] = {}
        for role, elapsed, ok in window:
            counts[role] = counts.get(role, 0) + 1
            if elapsed is not None:  # None: a busy role's call that was not timed
                by_role.setdefault(role, []).append(elapsed)
            if not ok:
                errors[role] = errors.get(role, 0) + 1
        wall = time.time()
        for role in set(counts) | set(self._roles) | set(in_flight):
            stats = self._roles.setdefault(role, RoleCalls())
            latencies = sorted(by_role.get(role, ()))
            stats.total += counts.get(role, 0)
            stats.errors += errors.get(role, 0)
            stats.rate = counts.get(role, 0) / span
            point: tuple = (round(wall, 3), round(stats.rate, 3), None, None)
            if latencies:
                stats.p50, stats.p99 = percentile(latencies, 50), percentile(latencies, 99)
                point = (*point[:2], round(stats.p50 * 1e3, 4), round(stats.p99 * 1e3, 4))
            stats.history.append(point)
        self._busy = frozenset(r for r, s in self._roles.items() if s.rate >= BUSY_RATE)
        return {role: s.as_dict(in_flight.get(role, 0)) for role, s in self._roles.items()}


def _drain(queue: deque) -> list:
    """Everything in ``queue`` now, removed; safe while other threads append."""
    items = []
    try:
        while True:
            items.append(queue.popleft())
    except IndexError:
        return items


class NullCallStats(CallStats):
    """Records nothing (the benchmark's 'before' and ``CORRAL_STATS=0``)."""

    enabled = False

    def begin(self, role: str) -> float | None:
        return 0.0

    def end(self, role: str, started: float | None, ok: bool = True) -> None:
        return None
