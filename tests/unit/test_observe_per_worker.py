"""Per-worker and per-method call figures, the hour of down-sampled history, the final
table of deleted roles, log search and the Prometheus families; no process started."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from corral.observe.call_stats import BUCKET_SECONDS, HISTORY_SECONDS, RECENT_POINTS, CallStats
from corral.observe.finished import FinishedRoles
from corral.observe.follow import follow_lines
from corral.observe.prometheus import render


def _worker(wid: str):
    return SimpleNamespace(role=wid.split("/")[0], id=wid)


def test_calls_are_split_per_worker_and_per_method():
    stats = CallStats()
    stats.sample(now=0.0)
    a, b = _worker("r/0"), _worker("r/1")
    for i in range(4):
        stats.end(a, stats.begin(a) - 0.002, ok=i != 0, method="gen")
    stats.end(b, stats.begin(b) - 0.010, method="train")
    open_call = stats.begin(b)
    out = stats.sample_all(now=1.0)
    assert out.roles["r"]["total"] == 5 and out.roles["r"]["in_flight"] == 1
    assert out.workers["r/0"]["total"] == 4 and out.workers["r/0"]["errors"] == 1
    assert out.workers["r/1"]["total"] == 1 and out.workers["r/1"]["in_flight"] == 1
    assert 9.9 < out.workers["r/1"]["p50_ms"] < 12 and out.workers["r/0"]["p50_ms"] < 9
    assert out.methods["r"]["gen"]["total"] == 4 and out.methods["r"]["gen"]["errors"] == 1
    assert out.methods["r"]["train"]["total"] == 1
    stats.end(b, open_call, method="train")
    out = stats.sample_all(now=2.0)
    assert out.workers["r/1"]["in_flight"] == 0 and out.workers["r/1"]["total"] == 2
    out = stats.sample_all(now=3.0)  # a second without calls: no latency, not the old one
    assert out.workers["r/0"]["p50_ms"] is None and out.methods["r"]["gen"]["p99_ms"] is None


def test_history_covers_an_hour_down_sampled():
    stats = CallStats()
    w = _worker("r/0")
    now = 0.0
    stats.sample(now=now)
    for _ in range(HISTORY_SECONDS + 120):
        stats.end(w, stats.begin(w), method="m")
        now += 1.0
        out = stats.sample(now=now, wall=now)
    history = out["r"]["history"]
    times = [p[0] for p in history]
    assert times == sorted(times)
    assert times[-1] - times[0] >= 3600 - 2 * BUCKET_SECONDS
    assert len(history) <= RECENT_POINTS + 3600 // BUCKET_SECONDS + 1
    old = history[: len(history) - RECENT_POINTS]
    assert all(b[0] - a[0] >= BUCKET_SECONDS - 1 for a, b in zip(old, old[1:], strict=False))
    assert all(p[1] > 0 and p[2] is not None for p in history)


def test_a_deleted_role_keeps_its_final_rows():
    finished = FinishedRoles()
    role = {"role": "r", "kind": "launched", "calls": {"total": 3, "rate": 2.0, "in_flight": 1,
            "p50_ms": 1.0, "p99_ms": 2.0, "errors": 0}}  # fmt: skip
    rows = [
        {"id": "r/0", "role": "r", "state": "running", "started": 100.0, "cpu_percent": 5.0},
        {"id": "r/1", "role": "r", "state": "failed", "started": 100.0, "died_at": 150.0,
         "exit_code": -9},
    ]  # fmt: skip
    finished.merge([role], rows, 160.0, {}, {})
    roles, workers = finished.merge([], [], 200.0, {"r": {**role["calls"], "total": 5}}, {})
    (r,) = roles
    assert r["state"] == "deleted" and r["ended"] == 200.0 and r["calls"]["total"] == 5
    assert r["calls"]["rate"] == 0.0 and r["calls"]["p50_ms"] is None
    stopped, failed = workers
    assert stopped["state"] == "stopped" and stopped["ended"] == 200.0
    assert stopped["duration"] == 100.0 and "cpu_percent" not in stopped
    assert failed["state"] == "failed" and failed["ended"] == 150.0 and failed["exit_code"] == -9
    roles, workers = finished.merge([], [], 300.0, {}, {})
    assert roles[0]["ended"] == 200.0  # the time it went, not the time of each snapshot


def test_log_search_reads_the_whole_file_then_follows_matches(tmp_path):
    path = tmp_path / "w.log"
    lines = [f"line {i}" + (" NEEDLE" if i % 1000 == 7 else "") for i in range(60000)]
    path.write_text("\n".join(lines) + "\n")
    stop = threading.Event()
    feed = follow_lines(str(path), stop, match="needle", poll=0.01)
    first = next(feed)
    assert first == [f"line {i} NEEDLE" for i in range(7, 60000, 1000)]  # not only the tail
    with open(path, "a") as fh:
        fh.write("new line\nnew needle line\n")
    batch = []
    while not batch:
        batch = next(feed)
    assert batch == ["new needle line"]
    stop.set()


def test_prometheus_has_per_worker_and_per_method_families():
    k = {"total": 3, "errors": 1, "in_flight": 0, "rate": 1.0, "p50_ms": 2.0, "p99_ms": None}
    snap = {
        "experiment": "e", "trial": "t",
        "roles": [{"role": "r", "calls": {**k, "history": []}, "methods": {"gen": k}}],
        "workers": [{"id": "r/0", "state": "running", "restarts": 0, "exit_code": None,
                     "calls": k, "cpu_percent": 12.5, "rss_bytes": 1024}],
    }  # fmt: skip
    text = render(snap)
    base = 'experiment="e",trial="t"'
    assert f'corral_worker_calls_total{{{base},worker="r/0"}} 3' in text
    assert f'corral_method_call_errors_total{{{base},role="r",method="gen"}} 1' in text
    assert (
        f'corral_worker_call_latency_seconds{{{base},worker="r/0",quantile="0.50"}} 0.002' in text
    )
    assert 'quantile="0.99"' not in text  # no calls in the window: no latency sample
    assert f'corral_worker_cpu_percent{{{base},worker="r/0"}} 12.5' in text
    assert f'corral_worker_rss_bytes{{{base},worker="r/0"}} 1024' in text


def test_a_worker_without_psutil_reports_no_figures_and_says_so(monkeypatch, capsys):
    import sys
    import threading
    from types import SimpleNamespace

    from corral.worker.usage import report_usage

    monkeypatch.setitem(sys.modules, "psutil", None)  # import psutil raises ImportError
    written = {}
    settings = SimpleNamespace(experiment="e", trial="t", role="r", index=0, worker_id="r/0")
    runtime = SimpleNamespace(
        settings=settings,
        stopped=threading.Event(),
        generation="1.0-1",
        name_resolve=SimpleNamespace(add=lambda k, v, replace=False: written.update({k: v})),
    )
    report_usage(runtime)  # returns at once: nothing to measure with
    assert written == {}
    assert "no CPU/memory figures" in capsys.readouterr().out


def test_the_usage_reporter_measures_nothing_until_the_start_burst_is_over(monkeypatch):
    """A worker's usage thread waits ``QUIET_START`` after registering before it makes its
    meter (psutil's import costs about a worker's whole start: the workers started beside
    it must not pay for it); a worker stopped meanwhile never makes one."""
    from corral.worker import usage

    waits: list[float] = []
    made: list[int] = []

    class Stopped:
        def wait(self, seconds: float) -> bool:
            waits.append(seconds)
            return True  # the worker stopped during the quiet start

        def is_set(self) -> bool:
            return True

    monkeypatch.delenv("CORRAL_STATS", raising=False)
    monkeypatch.setattr(usage, "TreeMeter", lambda pid: made.append(pid))
    settings = SimpleNamespace(experiment="e", trial="t", role="r", index=0, worker_id="r/0")
    usage.report_usage(SimpleNamespace(settings=settings, stopped=Stopped()))
    assert waits == [usage.QUIET_START] and usage.QUIET_START >= 1.0
    assert made == [], "the meter (and psutil) was made before the quiet start was over"
