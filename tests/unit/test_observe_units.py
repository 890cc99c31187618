"""Pieces of the live view that need no workers: call statistics, Prometheus text,
log following, and the packaged page (no CDN)."""

from __future__ import annotations

import re
import threading
import time

from corral.observe.call_stats import (
    CallStats,
    NullCallStats,
    percentile,
)
from corral.observe.dashboard import static_file
from corral.observe.follow import follow_lines
from corral.observe.prometheus import render


def test_percentile_is_nearest_rank():
    values = [float(i) for i in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile([], 50) == 0.0
    assert percentile([7.0], 99) == 7.0


def test_call_stats_count_rates_errors_latency_and_in_flight_per_role():
    stats = CallStats()
    stats.sample(now=100.0)
    for i in range(10):
        started = stats.begin("a")
        stats.end("a", started - 0.001 * (i + 1), ok=(i != 0))  # 1..10 ms
    open_call = stats.begin("b")
    out = stats.sample(now=102.0)
    assert out["a"]["total"] == 10 and out["a"]["errors"] == 1
    assert out["a"]["rate"] == 5.0  # 10 calls in 2 s
    assert 4.9 < out["a"]["p50_ms"] < 6.1 and 9.9 < out["a"]["p99_ms"] < 11.1
    assert out["b"]["in_flight"] == 1 and out["b"]["total"] == 0
    stats.end("b", open_call)
    out = stats.sample(now=103.0)
    assert out["b"]["in_flight"] == 0 and out["b"]["total"] == 1
    assert out["a"]["history"][-1][1:] == [0.0, None, None]  # an idle second: no latency
    assert out["a"]["p50_ms"] is None and out["a"]["p99_ms"] is None  # "–", not the old ones


def test_null_call_stats_record_nothing():
    stats = NullCallStats()
    stats.end("a", stats.begin("a"))
    assert stats.sample() == {}


def test_prometheus_text_escapes_labels_and_lists_families():
    snap = {
        "experiment": 'e"x',
        "trial": "t\\1",
        "roles": [
            {
                "role": "r",
                "calls": {
                    "total": 3,
                    "errors": 1,
                    "in_flight": 2,
                    "rate": 1.5,
                    "p50_ms": 2.0,
                    "p99_ms": 4.0,
                },
            }
        ],  # fmt: skip
        "workers": [{"id": "r/0", "state": "failed", "restarts": 1, "exit_code": -9}],
    }
    text = render(snap)
    assert 'corral_calls_total{experiment="e\\"x",trial="t\\\\1",role="r"} 3' in text
    assert (
        'corral_call_latency_seconds{experiment="e\\"x",trial="t\\\\1",role="r",quantile="0.99"} 0.004'
        in text
    )
    assert 'worker="r/0",state="failed"} 0' in text
    assert 'corral_worker_exit_code{experiment="e\\"x",trial="t\\\\1",worker="r/0"} -9' in text
    for line in text.splitlines():
        assert line.startswith("#") or re.fullmatch(r"[a-z_]+\{.*\} -?[0-9.e-]+", line), line
    assert render(None) == ""


def _collect(lines, count: int, timeout: float = 10.0) -> list[str]:
    """At least ``count`` lines from the follower, or what came within ``timeout``."""
    got: list[str] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        got += next(lines)
    return got


def test_follow_lines_gives_the_tail_then_new_lines_then_starts_over_after_truncation(tmp_path):
    path = tmp_path / "w.log"
    path.write_text("".join(f"old {i}\n" for i in range(500)) + "part")
    stop = threading.Event()
    lines = follow_lines(str(path), stop, last=3, poll=0.01)
    assert next(lines) == ["old 497", "old 498", "old 499"]
    with open(path, "a") as fh:
        fh.write("ial\nnew\n")
    assert _collect(lines, 2) == ["partial", "new"]
    path.write_text("fresh\n")
    assert _collect(lines, 1) == ["fresh"]
    stop.set()


def test_follow_lines_waits_for_a_file_that_does_not_exist_yet(tmp_path):
    stop = threading.Event()
    lines = follow_lines(str(tmp_path / "later.log"), stop, poll=0.01)
    assert next(lines) == []
    (tmp_path / "later.log").write_text("hello\n")
    assert _collect(lines, 1) == ["hello"]


def test_page_script_and_style_ship_in_the_package_and_load_nothing_from_elsewhere():
    for name in ("index.html", "dashboard.js", "dashboard.css"):
        text = static_file(name).decode()
        assert text.strip(), name
        urls = re.findall(r"(?:https?:)?//[\w.-]+\.[a-z]{2,}[^\s\"')]*", text)
        assert [u for u in urls if "www.w3.org/2000/svg" not in u] == [], (name, urls)
    page = static_file("index.html").decode()
    assert 'src="/static/dashboard.js"' in page and 'href="/static/dashboard.css"' in page


def test_a_counted_restart_without_a_new_generation_reads_restarting():
    from corral.observe.snapshot import SnapshotBuilder

    builder = SnapshotBuilder(None)
    assert builder._restart_state("r/0", 0, "g1") == "running"
    assert builder._restart_state("r/0", 1, "g1") == "restarting"  # old record, new count
    assert builder._restart_state("r/0", 1, "g2") == "running"  # the new process registered
    assert builder._restart_state("r/0", 1, "g2") == "running"


def test_call_stats_lose_no_call_while_threads_record_and_the_sampler_drains():
    stats = CallStats()
    per_thread, threads = 5000, 8
    go = threading.Event()

    def record():
        go.wait()
        for _ in range(per_thread):
            stats.end("r", stats.begin("r"))

    workers = [threading.Thread(target=record) for _ in range(threads)]
    for t in workers:
        t.start()
    go.set()
    samples = 0
    while any(t.is_alive() for t in workers):
        assert stats.sample().get("r", {"in_flight": 0})["in_flight"] >= 0
        samples += 1
    for t in workers:
        t.join()
    out = stats.sample()
    assert out["r"]["total"] == per_thread * threads and out["r"]["in_flight"] == 0
    assert samples > 1  # the sampler really ran while calls were being recorded
