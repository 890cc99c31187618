"""The controller's stats file on every backend: workers, call figures, failures, and the
opt-in Prometheus endpoint. Real workers; GPUs are declared, not physical."""

from __future__ import annotations

import asyncio
import os
import threading
import time
import urllib.error
import urllib.request

import pytest

from corral import Job, SchedulingSpec
from corral.cli import _deaths as cli_deaths
from corral.errors import ConfigError, EngineCallError
from tests.observe.helpers import role_row, stats_mode, wait_stats, worker_row

ENGINE = "corral.testing.engines.EchoEngine"


def _start(sched, replicas: int = 2, gpu: int = 1) -> list[str]:
    ids = sched.create_workers(
        Job(role="rollout", replicas=replicas, tasks=[SchedulingSpec(cpu=1, gpu=gpu)])
    )

    async def engines():
        await asyncio.gather(*(sched.create_engine(i, ENGINE, "e") for i in ids))

    asyncio.run(engines())
    return ids


def test_stats_file_lists_every_worker_with_its_placement_and_is_private(sched):
    ids = _start(sched)
    forked = sched.fork_workers(role="helper", target_role="rollout")
    workers = {w.id: w for w in sched.get_workers("rollout") + sched.get_workers("helper")}
    snap = wait_stats(
        sched,
        lambda s: [w["state"] for w in s["workers"]] == ["running"] * 4,
        what="4 running workers",
    )
    assert stats_mode(sched) == 0o600
    assert snap["experiment"] == sched.experiment_name and snap["backend"] == sched.backend
    for wid in ids + forked:
        row = worker_row(snap, wid)
        assert row["state"] == "running", row
        assert row["pid"] == workers[wid].pid and row["host"] == workers[wid].host
        assert row["generation"] == workers[wid].generation and row["started"] > 0
        assert row["gpus"] not in (None, ""), f"{wid} published no GPUs: {row}"
        assert row["restarts"] == 0 and row["exit_code"] is None
    assert worker_row(snap, forked[1])["forked_from"] == ids[1]
    assert role_row(snap, "helper")["kind"] == "forked"


def test_stats_count_calls_errors_and_latency_per_role(sched):
    (wid,) = _start(sched, replicas=1, gpu=0)
    for _ in range(50):
        sched.call_engine(wid, "noop", "e")
    with pytest.raises(EngineCallError):
        sched.call_engine(wid, "fail", "e")
    snap = wait_stats(
        sched, lambda s: role_row(s, "rollout")["calls"]["total"] == 51, what="51 calls"
    )
    calls = role_row(snap, "rollout")["calls"]
    assert calls["errors"] == 1
    seconds_with_calls = [p for p in calls["history"] if p[2] is not None]
    assert seconds_with_calls and all(0 < p[2] <= p[3] for p in seconds_with_calls)
    assert any(point[1] > 0 for point in calls["history"])


def test_stats_show_calls_in_flight(sched):
    (wid,) = _start(sched, replicas=1, gpu=0)
    thread = threading.Thread(target=sched.call_engine, args=(wid, "sleep", "e", 4.0))
    thread.start()
    try:
        wait_stats(
            sched, lambda s: role_row(s, "rollout")["calls"]["in_flight"] == 1, what="1 in flight"
        )
    finally:
        thread.join()
    wait_stats(sched, lambda s: role_row(s, "rollout")["calls"]["in_flight"] == 0, what="0")


def test_killed_worker_turns_failed_with_exit_code_and_log_tail(backend, sched):
    ids = _start(sched)
    victim = sched.get_workers("rollout")[1]
    backend.kill_worker(victim)
    snap = wait_stats(
        sched, lambda s: worker_row(s, ids[1])["state"] == "failed", what=f"{ids[1]} failed"
    )
    row = worker_row(snap, ids[1])
    assert row["reason"]
    if backend.name != "ray":  # Ray reports a dead actor without an exit code
        assert row["exit_code"] not in (None, 0), row
    assert f"corral worker {ids[1]}" in row["log_tail"]
    if backend.name == "slurm":  # fail-fast step (--kill-on-bad-exit): the sibling ends too
        wait_stats(
            sched, lambda s: worker_row(s, ids[0])["state"] == "failed", what=f"{ids[0]} failed"
        )
    else:
        assert worker_row(snap, ids[0])["state"] == "running"


def test_forked_child_that_dies_alone_turns_failed_with_its_exit_code(backend, sched):
    """The host worker lives on; its forked children die by themselves: one is SIGKILLed,
    one exits with code 3. Each turns failed with its own exit code and log tail."""
    _start(sched)
    killed, exits = sched.fork_workers(role="helper", target_role="rollout")
    asyncio.run(sched.create_engine(exits, ENGINE, "e"))
    backend.kill_worker(sched.get_workers("helper")[0])
    with pytest.raises(Exception):  # noqa: B017  (the worker is gone before it answers)
        sched.call_engine(exits, "exit_now", "e", 3)
    snap = wait_stats(
        sched,
        lambda s: {worker_row(s, w)["state"] for w in (killed, exits)} == {"failed"},
        what="both forked children failed",
    )
    if backend.name == "ray":  # forks are Ray actors: Ray reports a cause, no exit code
        for child in (killed, exits):
            row = worker_row(snap, child)
            assert row["exit_code"] is None and row["reason"].startswith("Ray actor died"), row
    else:  # the host worker's own record of its child
        assert worker_row(snap, killed)["exit_code"] == -9, worker_row(snap, killed)
        assert "SIGKILL" in worker_row(snap, killed)["reason"]
        assert worker_row(snap, exits)["exit_code"] == 3, worker_row(snap, exits)
        assert "code 3" in worker_row(snap, exits)["reason"]
    for child in (killed, exits):
        assert f"corral worker {child}" in worker_row(snap, child)["log_tail"]
    for host in ("rollout/0", "rollout/1"):
        assert worker_row(snap, host)["state"] == "running"
    # the same death records are what `corral ps` prints
    for _ in range(300):  # on Ray the controller's health monitor writes them
        deaths = cli_deaths(  # the raw store, as `corral ps` reads it, checked with the secret
            sched.name_resolve.inner, sched.experiment_name, sched.trial_name, sched.secret
        )
        if {killed, exits} <= set(deaths):
            break
        time.sleep(0.1)
    assert {killed, exits} <= set(deaths), deaths


def test_stats_file_is_marked_closed_when_the_trial_ends(sched):
    _start(sched, replicas=1, gpu=0)
    wait_stats(sched, lambda s: len(s["workers"]) == 1, what="1 worker")
    sched.close()
    snap = wait_stats(sched, lambda s: s["closed"], what="closed", timeout=5)
    (row,) = snap["workers"]  # the final table stays (corral.observe.finished)
    assert row["state"] == "stopped" and row["ended"] >= row["started"]


def test_prometheus_endpoint_is_off_by_default(sched):
    _start(sched, replicas=1, gpu=0)
    snap = wait_stats(sched, lambda s: len(s["workers"]) == 1, what="1 worker")
    assert "metrics_url" not in snap
    assert sched.parts.stats.metrics_server is None


def test_prometheus_endpoint_serves_call_and_worker_figures(backend, monkeypatch):
    monkeypatch.setenv("CORRAL_METRICS_PORT", "0")
    sched = backend.scheduler()
    try:
        (wid,) = _start(sched, replicas=1, gpu=0)
        for _ in range(5):
            sched.call_engine(wid, "noop", "e")
        snap = wait_stats(
            sched, lambda s: role_row(s, "rollout")["calls"]["total"] == 5, what="5 calls"
        )
        token_file = snap["metrics_token_file"]
        assert os.stat(token_file).st_mode & 0o777 == 0o600
        with open(token_file) as f:
            token = f.read()
        request = urllib.request.Request(
            snap["metrics_url"], headers={"Authorization": f"Bearer {token}"}
        )
        with urllib.request.urlopen(request, timeout=10) as reply:
            assert reply.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            text = reply.read().decode()
        labels = f'experiment="{sched.experiment_name}",trial="{sched.trial_name}"'
        assert f'corral_calls_total{{{labels},role="rollout"}} 5' in text
        assert f'corral_worker_up{{{labels},worker="{wid}",state="running"}} 1' in text
        assert "# TYPE corral_call_latency_seconds gauge" in text
    finally:
        sched.close()


def test_prometheus_endpoint_refuses_a_scraper_without_the_token(backend, monkeypatch):
    """Another local user can reach 127.0.0.1 too: no token (or a wrong one), no figures."""
    monkeypatch.setenv("CORRAL_METRICS_PORT", "0")
    monkeypatch.setenv("CORRAL_METRICS_TOKEN", "a-token-chosen-by-ops-1234")
    sched = backend.scheduler()
    try:
        _start(sched, replicas=1, gpu=0)
        snap = wait_stats(sched, lambda s: "metrics_url" in s, what="metrics url")
        for headers in ({}, {"Authorization": "Bearer not-the-token-at-all-0000"}):
            request = urllib.request.Request(snap["metrics_url"], headers=headers)
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(request, timeout=10)
            assert err.value.code == 401
            assert b"corral_calls_total" not in err.value.read()
        ok = urllib.request.Request(
            snap["metrics_url"], headers={"Authorization": "Bearer a-token-chosen-by-ops-1234"}
        )
        with urllib.request.urlopen(ok, timeout=10) as reply:
            assert b"corral_worker_up" in reply.read()
        with open(snap["metrics_token_file"]) as f:
            assert f.read() == "a-token-chosen-by-ops-1234"
    finally:
        sched.close()


def test_a_short_metrics_token_is_refused_before_workers_start(backend, monkeypatch):
    monkeypatch.setenv("CORRAL_METRICS_PORT", "0")
    monkeypatch.setenv("CORRAL_METRICS_TOKEN", "short")
    sched = backend.scheduler()
    try:
        with pytest.raises(ConfigError) as err:
            sched.create_workers(Job(role="r", replicas=1))
        assert "CORRAL_METRICS_TOKEN" in str(err.value) and "16" in str(err.value)
        assert "short" not in str(err.value)
        assert sched.roles == []
    finally:
        sched.close()


@pytest.mark.parametrize("value", ["http", "70000", "-1"])
def test_bad_metrics_port_is_refused_before_workers_start(backend, monkeypatch, value):
    monkeypatch.setenv("CORRAL_METRICS_PORT", value)
    sched = backend.scheduler()
    try:
        with pytest.raises(ConfigError) as err:
            sched.create_workers(Job(role="r", replicas=1))
        assert "CORRAL_METRICS_PORT" in str(err.value) and value in str(err.value)
        assert sched.roles == []
    finally:
        sched.close()


def test_a_restarted_worker_shows_its_restart_and_new_generation(backend, sched):
    from corral.errors import WorkerFailedError

    ids = sched.create_workers(
        Job(role="rollout", replicas=1, tasks=[SchedulingSpec(cpu=1, gpu=0, max_restarts=1)])
    )
    before = sched.get_workers("rollout")[0]
    backend.kill_worker(before)
    wait_stats(sched, lambda s: worker_row(s, ids[0])["state"] == "failed", what="failed")
    with pytest.raises(WorkerFailedError) as err:
        sched.call_engine(ids[0], "noop")
    assert err.value.restarted
    after = sched.get_workers("rollout")[0]
    snap = wait_stats(
        sched,
        lambda s: (
            worker_row(s, ids[0])["state"] == "running" and worker_row(s, ids[0])["restarts"] == 1
        ),
        what="running again after 1 restart",
    )
    row = worker_row(snap, ids[0])
    assert row["generation"] == after.generation != before.generation
    assert row["pid"] == after.pid and row["exit_code"] is None
