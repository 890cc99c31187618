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

import pytest

from corral import Job
from corral import name_resolve_keys as K
from corral.auth import TrialKeys, open_record
from corral.discovery import make_name_resolve
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


def test_top_and_ps_render_forged_etcd_records_inert(etcd_address, tmp_path) -> None:
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
        assert "\\x1b]0;PWNED" in top.stdout  # shown, escaped
        assert LINK in top.stdout  # as text, not turned into a link
        assert "x[/]\\x1b]0;PWNED" in top.stdout  # crashed top (MarkupError)
        ps = _cli(str(tmp_path), "ps", etcd=etcd_address)
        assert ps.returncode == 0, ps.stderr
        assert "\x1b" not in ps.stdout + ps.stderr and "\x07" not in ps.stdout + ps.stderr
        assert "oom" not in ps.stdout  # an unsigned death note is not believed
        assert "lease record not verified" in ps.stdout
    finally:
        attacker.close()


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
