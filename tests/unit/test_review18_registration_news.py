"""review18: the wait for registrations woken by output (cold3: Launcher.news,
worker_watch.wait_for_news); a reproducer of the review, fixed."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from corral.controller import worker_watch
from corral.controller.worker_watch import (
    FINE_POLL_PER_MISSING,
    registration_poll,
    wait_for_news,
)


def test_output_after_the_first_second_does_not_poll_finer_than_the_backoff(monkeypatch):
    clock = [1000.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock[0] += seconds

    monkeypatch.setattr(worker_watch.time, "sleep", sleep)
    monkeypatch.setattr(worker_watch.time, "monotonic", lambda: clock[0])
    launcher = SimpleNamespace(news=threading.Event())  # a local launcher's news
    missing = 1
    backoff = registration_poll(0.05, missing, waited=30.0)  # 30 s into a slow start
    assert backoff == 0.05
    launcher.news.set()  # a line of output from any worker
    wait_for_news(launcher, backoff, least=FINE_POLL_PER_MISSING * missing, waited=30.0)
    waited = clock[0] - 1000.0
    assert waited >= backoff / 2, (
        f"the next look comes after {waited * 1000:.1f} ms, not the {backoff * 1000:.0f} ms "
        "backoff: every output line during a long start is a look"
    )
