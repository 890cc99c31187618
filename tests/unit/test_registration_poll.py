"""How often the controller looks for new registrations (``worker_watch.registration_poll``):
finely in a start's first second, at most one record read per millisecond, then the
growing backoff (issue 29: a worker is ready in tens of ms; the backoff alone found it
15-20 ms late)."""

from __future__ import annotations

from corral.controller.worker_watch import registration_poll


def test_the_first_second_is_polled_every_5_ms_for_a_few_workers():
    assert registration_poll(0.038, missing=1, waited=0.08) == 0.005
    assert registration_poll(0.038, missing=5, waited=0.5) == 0.005


def test_the_fine_interval_grows_with_the_workers_still_missing():
    assert registration_poll(0.05, missing=32, waited=0.2) == 0.032  # 1 ms per record read
    assert registration_poll(0.05, missing=4096, waited=0.2) == 0.05  # never past the backoff


def test_the_backoff_applies_as_it_is_when_shorter_or_after_the_first_second():
    assert registration_poll(0.005, missing=32, waited=0.0) == 0.005
    assert registration_poll(0.038, missing=1, waited=1.5) == 0.038
