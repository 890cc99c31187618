"""Records from a shared store are verified before they change anything, and every
string shown from them is inert (issue 25, attack 2).

Before: one unsigned ``PUT <exp>/<trial>/_controller {"run_id": "attacker"}`` made the
controller give up its lease ("taken by run attacker") and its worker exit 5 s later;
``corral top --etcd`` passed forged host and role strings to rich as markup, with escape
sequences untouched (``x[/]`` crashed it); ``corral ps --etcd`` printed escape sequences
from an unverified death note, and a death note for worker ``w/x`` crashed it; ``corral
logs`` copied engine output to the terminal byte for byte.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid

import pytest

from corral import Job
from corral import name_resolve_keys as K
from corral.auth import TrialKeys, open_record
from corral.discovery import make_name_resolve
from corral.observe.source import TrialSource
from corral.paths import TrialPaths
from tests.integration.test_name_resolve_contract import LocalEtcd

ESCAPES = "\x1b]0;PWNED\x07\x1b[2J"
LINK = "[link=http://evil.example]login[/link]"


@pytest.fixture(params=["files", "etcd"])
def store(request, tmp_path):
    """The trial's name-resolve config: the private files store, or a real etcd (whose
    gateway anyone on the network can write)."""
    if request.param == "files":
        yield None
        return
    etcd = LocalEtcd(tmp_path / "etcd")
    address = etcd.start()
    try:
        yield {"type": "etcd3", "etcd3_addr": address}
    finally:
        etcd.stop()


def test_an_unsigned_lease_record_does_not_take_the_trial(local_backend, store) -> None:
    sched = local_backend.scheduler(name_resolve=store)
    try:
        (wid,) = sched.create_workers(Job(role="w", replicas=1))
        raw = sched.name_resolve.inner  # the store itself: what an attacker writes to
        key = K.controller_key(sched.experiment_name, sched.trial_name)
        forged = {"run_id": "attacker", "pid": 1, "host": "evil", "t": time.time(), "n": 0}
        raw.add(key, json.dumps(forged), replace=True)
        # the worker exited 5 s after this (lease timeout), the next call failed
        time.sleep(sched.lease_timeout + 4)
        assert sched.health(wid)["status"] == "ok"
        assert sched.call_engine  # the trial is still usable
        stored = raw.get(key)
        assert open_record(TrialKeys(sched.secret), key, stored) is not None, stored
    finally:
        sched.close()


def _cli(fileroot: str, *args: str, etcd: str | None = None) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "corral.cli", "--fileroot", fileroot]
    if etcd:
        argv += ["--etcd", etcd]
    env = {**os.environ, "COLUMNS": "400", "TERM": "xterm-256color"}
    return subprocess.run([*argv, *args], capture_output=True, text=True, timeout=120, env=env)


@pytest.fixture
def etcd_address(tmp_path):
    etcd = LocalEtcd(tmp_path / "etcd")
    address = etcd.start()
    yield address
    etcd.stop()


def test_top_and_ps_refuse_a_forged_etcd_trial(etcd_address, tmp_path) -> None:
    """A trial that exists only as unsigned records (no secret under the fileroot signs
    them): ``top`` does not show it at all; ``ps`` says its lease is not verified and
    believes none of its death notes; both exit 0 and print nothing raw."""
    attacker = make_name_resolve({"type": "etcd3", "etcd3_addr": etcd_address})
    try:
        lease = {"run_id": "r", "pid": 1, "host": ESCAPES, "t": time.time()}
        attacker.add("evil/t1/_controller", json.dumps(lease))
        attacker.add("evil/t1/w/0", "127.0.0.1:1")
        attacker.add("evil/t1/_info/w/0", json.dumps({"host": LINK, "pid": 5}))
        attacker.add("evil/t1/w/1", "127.0.0.1:1")
        attacker.add("evil/t1/_info/w/1", json.dumps({"host": f"x[/]{ESCAPES}"}))
        note = {"state": "dead", "reason": f"oom {ESCAPES}"}
        attacker.add("evil/t1/_health/w/0", json.dumps(note))
        attacker.add("evil/t1/_health/w/x", json.dumps(note))  # crashed ps for every trial
        top = _cli(str(tmp_path), "top", "--once", etcd=etcd_address)
        assert top.returncode == 0, top.stderr
        assert "\x1b" not in top.stdout and "\x07" not in top.stdout
        # before: the forged trial was listed, its hosts shown (escaped) as workers'
        assert "evil" not in top.stdout and "PWNED" not in top.stdout and "login" not in top.stdout
        ps = _cli(str(tmp_path), "ps", etcd=etcd_address)
        assert ps.returncode == 0, ps.stderr
        assert "\x1b" not in ps.stdout + ps.stderr and "\x07" not in ps.stdout + ps.stderr
        assert "oom" not in ps.stdout  # an unsigned death note is not believed
        assert "lease record not verified" in ps.stdout
    finally:
        attacker.close()


def _registered_trial(local_backend, store, monkeypatch):
    """A real trial whose controller writes no stats file (``CORRAL_STATS=0``): top and
    the dashboard know it from name-resolve only."""
    monkeypatch.setenv("CORRAL_STATS", "0")
    sched = local_backend.scheduler(name_resolve=store, experiment=f"reg-{uuid.uuid4().hex[:8]}")
    sched.create_workers(Job(role="w", replicas=1))
    return sched


def _top(local_backend, store) -> subprocess.CompletedProcess:
    etcd = store["etcd3_addr"] if store else None
    return _cli(local_backend.fileroot, "top", "--once", etcd=etcd)


def test_top_shows_only_records_signed_with_the_trial_secret(
    local_backend, store, monkeypatch
) -> None:
    """Forged records inside a real trial: a worker that does not exist, CPU figures for
    one that does, a second trial. None is shown as a worker or a figure; the trial's
    note names the refused records."""
    sched = _registered_trial(local_backend, store, monkeypatch)
    exp, trial = sched.experiment_name, sched.trial_name
    raw = sched.name_resolve.inner  # the store itself: what an attacker writes to
    try:
        generation = json.loads(sched.name_resolve.get(K.worker_info_key(exp, trial, "w", 0)))[
            "generation"
        ]
        raw.add(K.worker_address_key(exp, trial, "w", 7), "203.0.113.9:1")
        raw.add(K.worker_info_key(exp, trial, "w", 7), json.dumps({"host": "FORGEDHOST"}))
        usage = {"generation": generation, "cpu_percent": 31337.0, "rss_bytes": 1, "processes": 1}
        raw.add(K.worker_usage_key(exp, trial, "w", 0), json.dumps(usage), replace=True)
        lease = {"run_id": "r", "pid": 1, "host": "FORGEDCTL", "t": time.time()}
        raw.add(K.controller_key(exp, "forgedtrial"), json.dumps(lease))
        raw.add(K.worker_address_key(exp, "forgedtrial", "w", 0), "203.0.113.9:1")
        source = TrialSource(local_backend.fileroot, name_resolve=raw)
        listed = {t["trial"]: t for t in source.trials() if t["experiment"] == exp}
        assert list(listed) == [trial]  # the dashboard's list: not "forgedtrial"
        snap = listed[trial]
        assert snap["status"] == "registered"
        assert [w["id"] for w in snap["workers"]] == ["w/0"]
        assert "cpu_percent" not in snap["workers"][0]
        assert "_info/w/7" in snap["records_note"] and "_usage/w/0" in snap["records_note"]
        top = _top(local_backend, store)
        assert top.returncode == 0, top.stderr
        assert trial in top.stdout and "forgedtrial" not in top.stdout
        assert "FORGEDHOST" not in top.stdout and "203.0.113.9" not in top.stdout
        assert "31337" not in top.stdout
        assert "w/7" not in " ".join(x.split()[0] for x in top.stdout.splitlines() if x.strip())
        assert "not signed with this trial's secret" in top.stdout
    finally:
        sched.close()


def test_top_renders_signed_hostile_strings_inert(local_backend, etcd_address, monkeypatch) -> None:
    """Strings a trial's own worker signed (a host name, a role) still reach the terminal
    escaped and as text: no escape sequence, no rich markup, no crash on ``x[/]``."""
    store = {"type": "etcd3", "etcd3_addr": etcd_address}
    sched = _registered_trial(local_backend, store, monkeypatch)
    exp, trial = sched.experiment_name, sched.trial_name
    try:
        nr = sched.name_resolve  # signs with the trial's secret
        info = json.loads(nr.get(K.worker_info_key(exp, trial, "w", 0)))
        nr.add(K.worker_info_key(exp, trial, "w", 0), json.dumps({**info, "host": ESCAPES}), True)
        nr.add(K.worker_address_key(exp, trial, "w", 1), "127.0.0.1:1")
        nr.add(K.worker_info_key(exp, trial, "w", 1), json.dumps({"host": f"{LINK} x[/]"}))
        top = _top(local_backend, store)
        assert top.returncode == 0, top.stderr
        assert "\x1b" not in top.stdout and "\x07" not in top.stdout
        assert "\\x1b]0;PWNED\\x07\\x1b[2J" in top.stdout  # shown, escaped
        assert f"{LINK} x[/]" in top.stdout  # as text, not a link; x[/] crashed top
    finally:
        sched.close()


def test_ps_shows_signed_death_notes_inert(local_backend) -> None:
    """A death note the trial's own controller signed, whose reason quotes engine output."""
    sched = local_backend.scheduler()
    try:
        (wid,) = sched.create_workers(Job(role="w", replicas=1))
        key = K.worker_health_key(sched.experiment_name, sched.trial_name, "w", 0)
        sched.name_resolve.add(key, json.dumps({"state": "dead", "reason": f"boom {ESCAPES}"}))
        ps = _cli(local_backend.fileroot, "ps")
        assert ps.returncode == 0, ps.stderr
        line = next(x for x in ps.stdout.splitlines() if sched.trial_name in x and wid in x)
        assert "dead (boom \\x1b]0;PWNED\\x07\\x1b[2J)" in line
        assert "\x1b" not in ps.stdout
    finally:
        sched.close()


def test_logs_write_engine_output_inert(local_backend) -> None:
    sched = local_backend.scheduler()
    try:
        sched.create_workers(Job(role="w", replicas=1))
        paths = TrialPaths.of(local_backend.fileroot, sched.experiment_name, sched.trial_name)
        with open(paths.replica_log("w", 0), "a") as fh:
            fh.write(f"engine says {ESCAPES}\tdone\n")
        out = _cli(
            local_backend.fileroot, "logs", "w/0", "--experiment", sched.experiment_name,
            "--trial", sched.trial_name,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert "engine says \\x1b]0;PWNED\\x07\\x1b[2J\tdone" in out.stdout
        assert "\x1b" not in out.stdout
    finally:
        sched.close()


def test_a_forged_usage_record_never_reaches_the_live_view(local_backend, store) -> None:
    """The controller reads the workers' CPU/memory records (issue 26) from the store:
    a forged one, for a real worker and with its generation, rewritten as fast as the
    worker rewrites its own, never becomes a figure of the stats file (which top, the
    dashboard and Prometheus show); the worker's own signed figures do."""
    from tests.observe.helpers import read_stats, wait_stats, worker_row

    sched = local_backend.scheduler(name_resolve=store)
    try:
        (wid,) = sched.create_workers(Job(role="w", replicas=1))
        exp, trial = sched.experiment_name, sched.trial_name
        wait_stats(sched, lambda s: worker_row(s, wid).get("rss_bytes"), what="own figures")
        generation = worker_row(read_stats(sched), wid)["generation"]
        forged = {"generation": generation, "cpu_percent": 31337.0, "rss_bytes": 7, "processes": 1}
        key = K.worker_usage_key(exp, trial, "w", 0)
        seen = []
        deadline = time.monotonic() + 6.0  # three reads of the records by the controller
        while time.monotonic() < deadline:
            sched.name_resolve.inner.add(key, json.dumps(forged), replace=True)
            snap = read_stats(sched)
            if snap is not None:
                seen.append(worker_row(snap, wid).get("cpu_percent"))
            time.sleep(0.1)
        assert seen and 31337.0 not in seen, seen
        # the worker's next report (signed) replaces the forged record: figures again
        snap = wait_stats(sched, lambda s: worker_row(s, wid).get("rss_bytes"), what="figures")
        assert worker_row(snap, wid)["rss_bytes"] > 2**20 and 31337.0 not in seen
    finally:
        sched.close()
