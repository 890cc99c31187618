"""How often the controller looks for new registrations (``worker_watch.registration_poll``):
finely in a start's first second, at most one record read per millisecond, then the
growing backoff (issue 29: a worker is ready in tens of ms; the backoff alone found it
15-20 ms late); and on the local backend at once when a worker's output arrives."""

from __future__ import annotations

import os
from types import SimpleNamespace

from corral.backends.local import LocalLauncher
from corral.controller import worker_watch
from corral.controller.worker_watch import registration_poll, wait_for_news
from corral.launcher import Launcher
from corral.logs import replica_log_path


def test_the_first_second_is_polled_every_5_ms_for_a_few_workers():
    assert registration_poll(0.038, missing=1, waited=0.08) == 0.005
    assert registration_poll(0.038, missing=5, waited=0.5) == 0.005


def test_the_fine_interval_grows_with_the_workers_still_missing():
    assert registration_poll(0.05, missing=32, waited=0.2) == 0.032  # 1 ms per record read
    assert registration_poll(0.05, missing=4096, waited=0.2) == 0.05  # never past the backoff


def test_the_backoff_applies_as_it_is_when_shorter_or_after_the_first_second():
    assert registration_poll(0.005, missing=32, waited=0.0) == 0.005
    assert registration_poll(0.038, missing=1, waited=1.5) == 0.038


# ------------------------------------------------------------------ woken by output
def test_a_workers_output_wakes_the_local_wait_for_registrations(tmp_path):
    """A worker prints ``serving at`` once its records are written; the local launcher's
    log pump copies it to the logs, then sets ``news``, which ends the wait between two
    looks for registrations (not the next poll)."""
    launcher = LocalLauncher(gpu_devices=[])
    assert not launcher.news.is_set()
    read, write = os.pipe()
    launcher._pump.add(os.fdopen(read, "rb", buffering=0), str(tmp_path), "w", 0)
    try:
        os.write(write, b"corral worker w/0 serving at 127.0.0.1:1 (pid 1)\n")
        assert launcher.news.wait(60)
        with open(replica_log_path(str(tmp_path), "w", 0), "rb") as log:
            assert b"serving at" in log.read()  # copied before the news
    finally:
        os.close(write)


def test_the_wait_ends_on_news_and_takes_it():
    launcher = LocalLauncher(gpu_devices=[])
    launcher.news.set()
    wait_for_news(launcher, 60.0)  # a sleep of 60 s if the news were not heard
    assert not launcher.news.is_set()  # the next look's news is news again


def test_a_launcher_without_news_sleeps_between_looks(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(worker_watch.time, "sleep", slept.append)
    assert Launcher.news is None  # Ray, Slurm: their workers' output does not pass here
    wait_for_news(SimpleNamespace(news=None), 0.005)
    assert slept == [0.005]


def test_news_among_chatty_workers_still_waits_the_least_gap(monkeypatch):
    """Output wakes the wait at once, but the look after it comes no sooner than ``least``
    after the wait began (chatty workers do not turn the wait into a busy loop)."""
    slept: list[float] = []
    monkeypatch.setattr(worker_watch.time, "sleep", slept.append)
    launcher = LocalLauncher(gpu_devices=[])
    launcher.news.set()
    wait_for_news(launcher, 60.0, least=0.5)
    assert len(slept) == 1 and 0 < slept[0] <= 0.5
    assert not launcher.news.is_set()
