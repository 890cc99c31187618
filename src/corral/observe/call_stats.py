"""Engine-call statistics per role, per worker and per method, recorded in the
controller's call path.

The hook is two calls per engine call: ``begin(worker)`` (one deque append and a clock
read) and ``end(worker, started, ok, method)`` (a clock read and one deque append); no
lock, no dict lookup. ``worker`` is the ``Worker`` called (a plain role name is accepted
too: its figures count for the role only). Everything else — rates, percentiles, the
per-worker and per-method split, history — is computed once a second by ``sample()`` on
the publisher's thread, off the call path.

History (roles only): one point a second for the last five minutes, then one point per
ten seconds (down-sampled: mean rate, median p50, worst p99) back to one hour.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field

RECENT_POINTS = 300  # 1-second points: the last five minutes
BUCKET_SECONDS = 10  # the older history: one point per this many seconds...
LONG_POINTS = 360  # ...back to one hour
HISTORY_SECONDS = RECENT_POINTS + BUCKET_SECONDS * LONG_POINTS  # >= 3600 s published
HISTORY_POINTS = RECENT_POINTS  # (the older name: 1-second points kept)


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list (0.0 when empty)."""
    if not sorted_values:
        return 0.0
    rank = min(len(sorted_values), max(1, math.ceil(q / 100 * len(sorted_values))))
    return sorted_values[rank - 1]


def downsample(points: list[tuple]) -> tuple:
    """One history point for several: the last time, the mean rate, the median of the
    p50s and the worst p99 of the seconds that had calls (None when none had)."""
    p50s = sorted(p[2] for p in points if p[2] is not None)
    p99s = [p[3] for p in points if p[3] is not None]
    rate = sum(p[1] for p in points) / len(points)
    return (
        points[-1][0],
        round(rate, 3),
        p50s[len(p50s) // 2] if p50s else None,
        max(p99s) if p99s else None,
    )


class Figures:
    """Running totals and the figures of the last window of one series: a role, a
    worker, or one method of a role. ``p50``/``p99`` are None after a window without
    calls (shown as "–"), never the last value of an older window."""

    __slots__ = ("total", "errors", "rate", "p50", "p99", "recent", "long", "_pending")

    def __init__(self, history: bool = False) -> None:
        self.total = 0
        self.errors = 0
        self.rate = 0.0
        self.p50: float | None = None
        self.p99: float | None = None
        # (unix time, calls/s, p50 ms, p99 ms); latencies None in a second without calls
        self.recent: deque[tuple] | None = deque(maxlen=RECENT_POINTS) if history else None
        self.long: deque[tuple] | None = deque(maxlen=LONG_POINTS) if history else None
        self._pending: list[tuple] = []

    def close_window(self, latencies: list[float], errors: int, span: float, wall: float):
        latencies.sort()
        self.total += len(latencies)
        self.errors += errors
        self.rate = len(latencies) / span
        if latencies:
            self.p50, self.p99 = percentile(latencies, 50), percentile(latencies, 99)
        else:
            self.p50 = self.p99 = None
        if self.recent is None:
            return
        point = (round(wall, 3), round(self.rate, 3), _ms(self.p50), _ms(self.p99))
        if len(self.recent) == self.recent.maxlen:  # the oldest second leaves the recent
            self._pending.append(self.recent[0])
            if len(self._pending) >= BUCKET_SECONDS:
                self.long.append(downsample(self._pending))
                self._pending = []
        self.recent.append(point)

    def history(self) -> list[list]:
        if self.recent is None:
            return []
        return [list(p) for p in self.long] + [list(p) for p in self.recent]

    def as_dict(self, in_flight: int, history: bool = True) -> dict:
        out = {
            "total": self.total,
            "errors": self.errors,
            "in_flight": in_flight,
            "rate": round(self.rate, 3),
            "p50_ms": _ms(self.p50),
            "p99_ms": _ms(self.p99),
        }
        if history:
            out["history"] = self.history()
        return out


RoleCalls = Figures  # the older name


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e3, 4)


@dataclass
class CallFigures:
    """One sample: ``roles`` (with history), ``workers`` by worker id and ``methods`` by
    ``role`` then method name (no history), each as ``Figures.as_dict``."""

    roles: dict[str, dict] = field(default_factory=dict)
    workers: dict[str, dict] = field(default_factory=dict)
    methods: dict[str, dict[str, dict]] = field(default_factory=dict)


class CallStats:
    """Counts, rates, p50/p99 latency and calls in flight, per role, worker and method."""

    enabled = True

    def __init__(self) -> None:
        # deque.append and popleft are atomic: callers on any thread or event loop never
        # wait for a lock, and the sampler drains exactly what was appended.
        self._begun: deque = deque()
        self._ended: deque[tuple] = deque()
        self._in_flight: dict[tuple[str, str | None], int] = {}  # (role, worker id) -> n
        self._roles: dict[str, Figures] = {}
        self._workers: dict[str, Figures] = {}
        self._methods: dict[tuple[str, str], Figures] = {}
        self._last_sample = time.monotonic()
        self._sampling = threading.Lock()

    # ------------------------------------------------------------ the hook
    def begin(self, worker) -> float:
        self._begun.append(worker)
        return time.perf_counter()

    def end(self, worker, started: float, ok: bool = True, method: str | None = None) -> None:
        self._ended.append((worker, method, time.perf_counter() - started, ok))

    # ------------------------------------------------------------ sampling
    def sample(self, now: float | None = None, wall: float | None = None) -> dict[str, dict]:
        """Close the current window; the per-role figures (history included)."""
        return self.sample_all(now, wall).roles

    def sample_all(self, now: float | None = None, wall: float | None = None) -> CallFigures:
        """Close the current window: update totals, rates and percentiles of every
        role, worker and method; return them all. ``now``: a monotonic clock reading;
        ``wall``: the unix time of the history point (default: the time now)."""
        with self._sampling:
            now = time.monotonic() if now is None else now
            return self._sample(now, time.time() if wall is None else wall)

    def _sample(self, now: float, wall: float) -> CallFigures:
        window = _drain(self._ended)  # ended first: a call drained here has begun below
        flying = self._in_flight
        for worker in _drain(self._begun):
            key = _identity(worker)
            flying[key] = flying.get(key, 0) + 1
        span = max(now - self._last_sample, 1e-3)
        self._last_sample = now
        # one dict operation per call: group by (worker object, method); the role,
        # worker and method figures are then merged from the (few) groups
        groups: dict[tuple[int, str | None], list[float]] = {}
        failed: dict[tuple[int, str | None], int] = {}
        called: dict[int, object] = {}
        for worker, method, elapsed, ok in window:
            key = (id(worker), method)
            latencies = groups.get(key)
            if latencies is None:
                groups[key] = latencies = []
                called[key[0]] = worker
            latencies.append(elapsed)
            if not ok:
                failed[key] = failed.get(key, 0) + 1
        by_role: dict[str, list[float]] = {}
        by_worker: dict[str, list[float]] = {}
        by_method: dict[tuple[str, str], list[float]] = {}
        errors: dict = {}
        for key, latencies in groups.items():
            role, wid = identity = _identity(called[key[0]])
            method = key[1]
            flying[identity] -= len(latencies)
            by_role.setdefault(role, []).extend(latencies)
            if wid is not None:
                by_worker.setdefault(wid, []).extend(latencies)
            if method is not None:
                by_method.setdefault((role, method), []).extend(latencies)
            if key in failed:
                for name in (role, ("w", wid), ("m", role, method)):
                    errors[name] = errors.get(name, 0) + failed[key]
        in_role: dict[str, int] = {}
        in_worker: dict[str, int] = {}
        for (role, wid), n in flying.items():
            in_role[role] = in_role.get(role, 0) + n
            if wid is not None:
                in_worker[wid] = in_worker.get(wid, 0) + n
        _close(self._roles, by_role, in_role, lambda k: errors.get(k, 0), span, wall, True)
        _close(self._workers, by_worker, in_worker, lambda k: errors.get(("w", k), 0), span, wall)
        _close(self._methods, by_method, {}, lambda k: errors.get(("m", *k), 0), span, wall)
        methods: dict[str, dict[str, dict]] = {}
        for (role, method), figures in self._methods.items():
            methods.setdefault(role, {})[method] = figures.as_dict(0, history=False)
        return CallFigures(
            roles={r: f.as_dict(in_role.get(r, 0)) for r, f in self._roles.items()},
            workers={
                w: f.as_dict(in_worker.get(w, 0), history=False) for w, f in self._workers.items()
            },
            methods=methods,
        )


def _identity(worker) -> tuple[str, str | None]:
    """(role, worker id) of what the hook was given: a Worker, or a role name."""
    if isinstance(worker, str):
        return worker, None
    return worker.role, worker.id


def _close(series: dict, window: dict, in_flight: dict, errors, span, wall, history=False):
    for key in set(window) | set(series) | set(in_flight):
        figures = series.get(key)
        if figures is None:
            figures = series[key] = Figures(history)
        figures.close_window(window.get(key, []), errors(key), span, wall)


def _drain(queue: deque) -> list:
    """What ``queue`` held when called, removed; safe while other threads append (only
    this, the sampler, removes items: the first ``len`` items are there to take)."""
    take = queue.popleft
    return [take() for _ in range(len(queue))]


class NullCallStats(CallStats):
    """Records nothing (the benchmark's 'before' and ``CORRAL_STATS=0``)."""

    enabled = False

    def begin(self, worker) -> float:
        return 0.0

    def end(self, worker, started: float, ok: bool = True, method: str | None = None) -> None:
        return None
