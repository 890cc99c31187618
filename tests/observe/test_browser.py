"""The dashboard in a real browser: Debian's headless Chromium, driven over the DevTools
protocol, loads the page while a real trial runs (local backend, a real Ray cluster and
the Slurm lab cluster), and the test reads the rendered DOM: workers listed, a killed
worker turning failed with its exit code (on Ray: its death cause; Ray reports no exit
code) and log tail, a forked child that dies alone (its host alive) turning failed with
its own exit code, a worker's log streaming new lines. GPUs are declared, not physical.
``CORRAL_UPDATE_SCREENSHOT=1`` also writes docs/img/dashboard.png.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
import uuid

import pytest

from corral import Job, SchedulingSpec
from corral.observe.dashboard import Dashboard
from corral.observe.source import TrialSource
from tests.conformance.harness import require_service
from tests.observe.helpers import wait_stats, worker_row
from tests.support.browser import Browser, BrowserError, chromium_path

ENGINE = "corral.testing.engines.EchoEngine"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UPDATE_SCREENSHOT = bool(os.environ.get("CORRAL_UPDATE_SCREENSHOT"))
BACKENDS = [b for b in os.environ.get("CORRAL_TEST_BACKENDS", "local,ray,slurm").split(",")]


@pytest.fixture(params=[b for b in ("local", "ray", "slurm") if b in BACKENDS])
def browser_backend(request):
    return request.getfixturevalue(f"{request.param}_backend")


@pytest.fixture
def browser():
    if chromium_path() is None:
        require_service("chromium", "no chromium on PATH (apt-get install chromium)")
    try:
        import websocket  # noqa: F401
    except ImportError:
        require_service("chromium", "websocket-client is not installed (pip install -e .[dev])")
    try:
        b = Browser()
    except BrowserError as exc:
        require_service("chromium", str(exc))
    yield b
    b.close()


def _q(text: str) -> str:
    return json.dumps(text)


def test_dashboard_in_chromium_lists_workers_streams_logs_and_shows_a_failure(
    browser_backend, browser, tmp_path
):
    backend = browser_backend
    sched = backend.scheduler()
    dash = None
    stop = threading.Event()
    try:
        ids = sched.create_workers(
            Job(role="rollout", replicas=2, tasks=[SchedulingSpec(cpu=1, gpu=1)])
        )

        async def engines():
            await asyncio.gather(*(sched.create_engine(i, ENGINE, "e") for i in ids))

        asyncio.run(engines())
        helpers = sched.fork_workers(role="reward", target_role="rollout")
        workers = {w.id: w for w in sched.get_workers("rollout") + sched.get_workers("reward")}

        def load():  # calls keep flowing so the plots have something to draw
            beat = 0
            while not stop.wait(0.02 if beat % 200 < 100 else 0.005):
                beat += 1
                try:
                    if beat % 25 == 0:  # now and then a slower call, for the p99 line
                        sched.call_engine(ids[0], "sleep", "e", 0.002 * (beat % 7))
                    else:
                        sched.call_engine(ids[0], "noop", "e")
                except Exception:
                    return

        threading.Thread(target=load, daemon=True).start()
        exp, trial = sched.experiment_name, sched.trial_name
        dash = Dashboard(TrialSource(backend.fileroot, exp, trial), port=0).serve_in_thread()
        browser.goto(f"{dash.url}&log={exp}/{trial}/{ids[0]}")

        # every worker is listed, running, with its pid (and Slurm job id) in its row
        browser.wait_for(
            "document.querySelectorAll('tr[data-worker][data-state=running]').length === 4",
            what="4 running workers",
        )
        for wid in ids + helpers:
            cell = browser.eval(
                f"document.querySelector('tr[data-worker={_q(wid)}] .placement').textContent"
            )
            assert f"pid {workers[wid].pid}" in cell, (wid, cell)
            if backend.name == "slurm" and wid in ids:
                assert f"job {workers[wid].backend_id}" in cell, (wid, cell)
        assert browser.eval("document.getElementById('conn').dataset.state") == "live"

        # the rate plot of the called role has a line; its call count rises
        browser.wait_for(
            "document.querySelector('figure[data-role=rollout] svg path.rate') !== null",
            what="a drawn call-rate line",
        )
        browser.wait_for(
            "Number(document.querySelector('tr[data-role=rollout] .calls-total').textContent) > 10",
            what="more than 10 calls counted",
        )

        # the log viewer (opened from the address) follows new lines
        for _ in range(2):
            marker = f"dashboard-marker-{uuid.uuid4().hex}"
            sched.call_engine(ids[0], "say", "e", marker)
            browser.wait_for(
                f"document.getElementById('log-view').innerText.includes({_q(marker)})",
                what=f"log line {marker}",
            )

        if UPDATE_SCREENSHOT:  # let the plots fill before the picture for the docs
            time.sleep(float(os.environ.get("CORRAL_SCREENSHOT_SECONDS", "45")))

        # a forked child that dies alone (its host lives on) turns failed with its own code;
        # first, while every host surely lives (on Slurm a killed replica can end its
        # whole job, and with it the other replicas)
        backend.kill_worker(workers[helpers[0]])
        wait_stats(
            sched, lambda s: worker_row(s, helpers[0])["state"] == "failed", what="child failed"
        )
        child = f"document.querySelector('tr[data-worker={_q(helpers[0])}]')"
        browser.wait_for(f"{child}.dataset.state === 'failed'", what=f"{helpers[0]} failed")
        failure = browser.wait_for(
            f"document.querySelector('.failure[data-worker={_q(helpers[0])}]')?.innerText",
            what="the forked child's failure box",
        )
        shown = browser.eval(f"{child}.querySelector('.exit-code').textContent")
        if backend.name == "ray":  # a Ray fork is an actor: its death cause, no exit code
            assert shown == "" and "Ray actor died" in failure, failure
        else:
            assert shown == "-9" and "exit code -9" in failure and "SIGKILL" in failure, failure

        # a killed worker turns failed, with the exit code its backend reports
        backend.kill_worker(workers[ids[1]])
        snap = wait_stats(
            sched, lambda s: worker_row(s, ids[1])["state"] == "failed", what="failed"
        )
        code, reason = worker_row(snap, ids[1])["exit_code"], worker_row(snap, ids[1])["reason"]
        if backend.name == "ray":  # Ray reports a dead actor's cause, not an exit code
            assert code is None and reason.startswith("Ray actor died"), reason
        else:
            assert code not in (None, 0)
        row = f"document.querySelector('tr[data-worker={_q(ids[1])}]')"
        browser.wait_for(f"{row}.dataset.state === 'failed'", what=f"{ids[1]} failed")
        shown = browser.eval(f"{row}.querySelector('.exit-code').textContent")
        assert shown == ("" if code is None else str(code))
        failure = browser.wait_for(
            f"document.querySelector('.failure[data-worker={_q(ids[1])}]')?.innerText",
            what="the failure box",
        )
        assert f"corral worker {ids[1]}" in failure and reason[:40] in failure, failure
        if code is not None:
            assert f"exit code {code}" in failure
        sibling = f"document.querySelector('tr[data-worker={_q(ids[0])}]').dataset.state"
        if backend.name == "slurm":  # fail-fast step (--kill-on-bad-exit): it ends too
            browser.wait_for(f"{sibling} === 'failed'", what=f"{ids[0]} failed with its step")
        else:
            assert browser.eval(sibling) == "running"

        shot = tmp_path / "dashboard.png"
        height = browser.eval("document.documentElement.scrollHeight")
        browser.screenshot(str(shot), height=min(int(height), 1600))
        assert shot.stat().st_size > 10_000
        if UPDATE_SCREENSHOT and backend.name == "local":
            browser.screenshot(os.path.join(REPO, "docs", "img", "dashboard.png"),
                               height=min(int(height), 1600))  # fmt: skip
        assert not [c for c in browser.console if c.startswith("exception")], browser.console
    finally:
        stop.set()
        if dash is not None:
            dash.close()
        sched.close()
    left = backend.leftovers(sched.experiment_name, sched.trial_name)
    assert not left, f"left behind after close(): {left}"
