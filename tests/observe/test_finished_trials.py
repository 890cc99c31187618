"""Finished trials stay inspectable, and the live view has figures per worker.

Real workers. A trial that ended (the demo, run as a user runs it) still shows its final
table in ``corral top --once`` and in the page in headless Chromium: every role and
worker, final state, exit code, call counts, how long each ran and when it ended. While
a trial runs, each worker row carries its own calls, errors and latency, and (local
backend) the CPU and memory of its process tree.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys

from corral import Job, SchedulingSpec
from corral.observe.dashboard import Dashboard
from corral.observe.source import TrialSource
from tests.observe.helpers import role_row, wait_stats, worker_row
from tests.observe.test_browser import browser  # noqa: F401 (the Chromium fixture)

ENGINE = "corral.testing.engines.EchoEngine"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEMO_WORKERS = ["rollout/0", "rollout/1", "reward/0", "reward/1", "trainer/0", "trainer/1"]


def _cli(fileroot, *argv, env=None, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "corral.cli", "--fileroot", str(fileroot), *argv],
        cwd=REPO, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "COLUMNS": "250", **(env or {})},
    )  # fmt: skip


def test_demo_then_top_once_and_the_page_show_the_final_table(browser, tmp_path):  # noqa: F811
    demo = _cli(tmp_path, "demo", "--steps", "3", "--no-torch")
    assert demo.returncode == 0, demo.stderr
    experiment, trial = re.search(r"logs\s+\S+/logs/[^/]+/([^/]+)/(\S+)", demo.stdout).groups()

    top = _cli(tmp_path, "top", "--once")
    assert top.returncode == 0, top.stderr
    text = top.stdout
    assert f"{experiment} / {trial}" in text and "ended" in text, text
    for role in ("rollout", "reward", "trainer"):
        assert re.search(rf"^{role}\s+(launched|forked)", text, re.M), text
    for wid in DEMO_WORKERS:
        row = re.search(rf"^{re.escape(wid)}\b.*$", text, re.M)
        assert row, (wid, text)
        assert "stopped" in row.group(0) and "ran " in row.group(0), row.group(0)
        calls = re.search(r"stopped\s+ran \S+\s+\d+\s+(\d+)\s+0\s+–", row.group(0))
        assert calls and int(calls.group(1)) > 0, row.group(0)
        assert re.search(r"\d\d:\d\d:\d\d\s*$", row.group(0)), row.group(0)  # when it ended
    assert re.search(r"^rollout\s+generate\s+6\s+0", text, re.M), text  # 3 steps x 2 rollouts

    with open(os.path.join(tmp_path, "secrets", experiment, trial, "stats.json")) as fh:
        snap = json.load(fh)
    assert snap["closed"] and {w["id"] for w in snap["workers"]} == set(DEMO_WORKERS)
    for w in snap["workers"]:
        assert w["state"] == "stopped" and w["ended"] >= w["started"] and w["duration"] > 0
        assert w["calls"]["total"] > 0, w

    dash = Dashboard(TrialSource(str(tmp_path)), port=0).serve_in_thread()
    try:
        browser.goto(dash.url)
        browser.wait_for(
            "document.querySelectorAll('tr[data-worker][data-state=stopped]').length === 6",
            what="the demo's 6 workers, stopped",
        )
        for wid in DEMO_WORKERS:
            row = f"document.querySelector('tr[data-worker={json.dumps(wid)}]')"
            calls = browser.eval(f"{row}.querySelector('.calls-total').textContent")
            assert int(calls) > 0, (wid, calls)
            assert browser.eval(f"{row}.querySelector('.uptime').textContent").startswith("ran ")
            assert browser.eval(f"{row}.querySelector('.ended').textContent") != ""
        generate = browser.eval(
            "document.querySelector('tr[data-role=rollout][data-method=generate] "
            ".calls-total').textContent"
        )
        assert generate == "6"
        # the log viewer searches the whole file: only the matching lines come
        browser.eval("document.getElementById('log-search').value = 'sigterm'")
        browser.eval(f"openLog({json.dumps(experiment)}, {json.dumps(trial)}, 'rollout/0')")
        shown = browser.wait_for(
            "document.querySelectorAll('#log-view .log-line').length > 0 && "
            "[...document.querySelectorAll('#log-view .log-line')].map(e => e.textContent)",
            what="the log lines that match the search",
        )
        assert shown and all("sigterm" in line.lower() for line in shown), shown
        section = "document.querySelector('section.trial')"
        assert browser.eval(f"{section}.dataset.status") == "ended"
        assert not [c for c in browser.console if c.startswith("exception")], browser.console
    finally:
        dash.close()


def test_each_worker_row_has_its_calls_latency_and_resource_use(backend, sched):
    ids = sched.create_workers(
        Job(role="rollout", replicas=2, tasks=[SchedulingSpec(cpu=1, gpu=0)])
    )

    async def engines():
        await asyncio.gather(*(sched.create_engine(i, ENGINE, "e") for i in ids))

    asyncio.run(engines())
    for _ in range(20):
        sched.call_engine(ids[0], "noop", "e")
    sched.call_engine(ids[1], "sleep", "e", 0.05)
    snap = wait_stats(
        sched,
        lambda s: (
            worker_row(s, ids[0])["calls"]["total"] == 20
            and worker_row(s, ids[1])["calls"]["total"] == 1
        ),
        what="20 calls on one worker, 1 on the other",
    )
    assert worker_row(snap, ids[1])["calls"]["errors"] == 0
    methods = role_row(snap, "rollout")["methods"]
    assert methods["noop"]["total"] == 20 and methods["sleep"]["total"] == 1
    # a quiet second: latency "–" (None), not the last figure
    snap = wait_stats(
        sched, lambda s: worker_row(s, ids[0])["calls"]["p50_ms"] is None, what="no latency"
    )
    # every backend: each worker measures its own process tree and publishes it
    snap = wait_stats(
        sched,
        lambda s: all(worker_row(s, i).get("rss_bytes") for i in ids),
        what=f"CPU and memory per worker on {backend.name}",
    )
    for wid in ids:
        row = worker_row(snap, wid)
        assert row["rss_bytes"] > 10 * 2**20 and row["cpu_percent"] >= 0, row
        assert row["processes"] >= 1
    # ... and top and the Prometheus text show them
    from rich.console import Console

    from corral.observe.prometheus import render as prometheus_text
    from corral.observe.top import render as top_render

    console = Console(width=400, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(top_render([{**snap, "status": "live", "age": 0.0}]))
    shown = console.export_text()
    for wid in ids:
        line = next(x for x in shown.splitlines() if x.lstrip().startswith(wid))
        assert "MiB" in line and "%" in line, line
    metrics = prometheus_text(snap)
    for wid in ids:
        assert f'worker="{wid}"}} {worker_row(snap, wid)["rss_bytes"]}' in metrics, metrics
