"""The dashboard server over plain HTTP, on a real local trial: authentication, the
trials API, server-sent events, log streaming, and names that try to leave the fileroot."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import time
import uuid
from types import SimpleNamespace

import pytest

from corral import Job
from corral.observe.dashboard import Dashboard
from corral.observe.source import TrialSource
from tests.conformance.harness import sigint_not_ignored
from tests.observe.helpers import wait_stats

ENGINE = "corral.testing.engines.EchoEngine"


@pytest.fixture
def trial(local_backend):
    sched = local_backend.scheduler()
    (wid,) = sched.create_workers(Job(role="rollout", replicas=1))
    asyncio.run(sched.create_engine(wid, ENGINE, "e"))
    wait_stats(sched, lambda s: len(s["workers"]) == 1, what="1 worker")
    yield sched, wid
    sched.close()


@pytest.fixture
def dash(local_backend, trial):
    sched, _ = trial
    server = Dashboard(TrialSource(local_backend.fileroot, max_age=600), port=0)
    server.serve_in_thread()
    yield server
    server.close()


def _get(dash, path: str, token: str | None = None, timeout: float = 10, method="GET", **headers):
    conn = http.client.HTTPConnection("127.0.0.1", dash.port, timeout=timeout)
    if token:
        headers["Authorization"] = f"Bearer {token}"
    conn.request(method, path, headers=headers)
    return conn, conn.getresponse()


def _events(response, wanted: str, count: int = 1, limit: int = 200) -> list:
    """Read server-sent events from ``response`` until ``count`` events named ``wanted``."""
    found, name = [], None
    for _ in range(limit):
        line = response.fp.readline().decode().rstrip("\n")
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: ") and name == wanted:
            found.append(json.loads(line[6:]))
            if len(found) == count:
                return found
    raise AssertionError(f"no {count} {wanted!r} event(s) in {limit} lines")


def test_a_connection_that_never_sends_a_request_is_closed(local_backend):
    """Another local user's idle connections do not hold the dashboard (10 s per head)."""
    server = Dashboard(TrialSource(local_backend.fileroot), port=0).serve_in_thread()
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\n")  # and never the rest of the head
            assert sock.recv(1024) == b""  # closed by the server, not by our 30 s timeout
    finally:
        server.close()


@pytest.mark.parametrize("path", ["/api/trials", "/events", "/logs", "/nope"])
def test_every_data_path_needs_the_token_in_a_header(dash, path):
    _, r = _get(dash, path)
    assert r.status == 401
    _, r = _get(dash, path, token="wrong")
    assert r.status == 401
    _, r = _get(dash, f"{path}?token={dash.token}")  # never in the address
    assert r.status == 401
    _, r = _get(dash, path, Cookie=f"corral_dash_{dash.port}={dash.token}")  # no cookies
    assert r.status == 401


def test_the_page_is_public_and_the_login_code_works_once(dash):
    _, page = _get(dash, "/")
    assert page.status == 200 and b"/static/session.js" in page.read()
    assert "default-src 'self'" in page.getheader("Content-Security-Policy")
    assert page.getheader("Set-Cookie") is None
    code = dash.url.split("#login=")[1]
    _, r = _get(dash, "/api/session", token=code, method="POST")
    assert r.status == 200 and r.getheader("Set-Cookie") is None
    session = json.load(r)["session"]
    _, r = _get(dash, "/api/trials", token=session)
    assert r.status == 200
    _, again = _get(dash, "/api/session", token=code, method="POST")
    assert again.status == 401


def test_trials_api_and_events_carry_the_running_trial(dash, trial):
    sched, wid = trial
    _, r = _get(dash, "/api/trials", token=dash.token)
    listed = {(t["experiment"], t["trial"]): t for t in json.load(r)}
    snap = listed[(sched.experiment_name, sched.trial_name)]
    assert snap["status"] == "live" and [w["id"] for w in snap["workers"]] == [wid]
    conn, r = _get(dash, "/events", token=dash.token)
    assert r.getheader("Content-Type") == "text/event-stream"
    first, second = _events(r, "trials", count=2)
    assert any(t["trial"] == sched.trial_name for t in first)
    assert any(t["trial"] == sched.trial_name for t in second)
    conn.close()


def test_log_stream_sends_the_tail_then_new_lines(dash, trial):
    sched, wid = trial
    query = f"experiment={sched.experiment_name}&trial={sched.trial_name}&worker={wid}"
    conn, r = _get(dash, f"/logs?{query}", token=dash.token)
    (path,) = _events(r, "path")
    assert path.endswith(f"{wid}.log")
    (tail,) = _events(r, "lines")
    assert any(f"corral worker {wid}" in line for line in tail)
    marker = f"marker-{uuid.uuid4().hex}"
    sched.call_engine(wid, "say", "e", marker)
    seen: list[str] = []
    deadline = time.monotonic() + 30
    while marker not in seen and time.monotonic() < deadline:
        seen += _events(r, "lines", limit=20)[0]
    conn.close()
    assert marker in seen


@pytest.mark.parametrize("experiment", ["..", "../../etc", "a/b"])
def test_names_that_leave_the_fileroot_are_refused(dash, experiment):
    _, r = _get(dash, f"/logs?experiment={experiment}&trial=t&worker=w/0", token=dash.token)
    assert r.status == 400
    assert "experiment" in json.load(r)["error"]


def test_the_trial_secret_is_never_a_dashboard_token(local_backend, trial):
    sched, _ = trial
    source = TrialSource(local_backend.fileroot, sched.experiment_name, sched.trial_name)
    server = Dashboard(source, port=0).serve_in_thread()
    try:
        _, r = _get(server, "/api/trials", token=sched.secret)
        assert r.status == 401
        _, r = _get(server, "/api/session", token=sched.secret, method="POST")
        assert r.status == 401
    finally:
        server.close()


def test_a_busy_port_is_a_config_error_naming_the_port(dash):
    from corral.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        Dashboard(dash.source, port=dash.port)
    assert "--port" in str(err.value) and f"127.0.0.1:{dash.port}" in str(err.value)


@pytest.mark.parametrize("host, port", [("127.0.0.1", 70000), ("no-such-host.invalid", 0)])
def test_bad_listen_address_is_a_config_error(tmp_path, host, port):
    from corral.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        Dashboard(TrialSource(str(tmp_path)), host=host, port=port)
    assert "--host/--port" in str(err.value) and f"{host}:{port}" in str(err.value)


def test_corral_dashboard_command_prints_a_working_address(local_backend, trial):
    import os
    import signal
    import subprocess
    import sys
    import urllib.request

    sched, wid = trial
    proc = subprocess.Popen(
        [sys.executable, "-m", "corral.cli", "--fileroot", local_backend.fileroot,
         "dashboard", sched.experiment_name, sched.trial_name, "--port", "0"],
        stdout=subprocess.PIPE, text=True, preexec_fn=sigint_not_ignored,
    )  # fmt: skip
    try:
        first = proc.stdout.readline().strip()
        assert first.startswith("corral dashboard: http://127.0.0.1:"), first
        url = first.split(": ", 1)[1]
        base, code = url.split(" ")[0].split("#login=")
        login = urllib.request.Request(
            f"{base}api/session", method="POST", headers={"Authorization": f"Bearer {code}"}
        )
        with urllib.request.urlopen(login, timeout=10) as r:
            session = json.load(r)["session"]
        trials = urllib.request.Request(
            f"{base}api/trials", headers={"Authorization": f"Bearer {session}"}
        )
        with urllib.request.urlopen(trials, timeout=10) as r:
            (only,) = json.load(r)
        assert only["trial"] == sched.trial_name and only["workers"][0]["id"] == wid
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"{base}api/trials", timeout=10)
        assert err.value.code == 401
    finally:
        os.kill(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=10) == 130
        proc.stdout.close()


@pytest.mark.parametrize("named", [False, True], ids=["all-trials", "one-trial"])
def test_corral_dashboard_refuses_an_empty_token(local_backend, trial, named):
    """Every data request needs a token: an empty ``Authorization: Bearer``, an empty
    ``?token=`` or an empty cookie is no login, whether or not the command was given a
    trial; the API token from ``CORRAL_DASHBOARD_TOKEN`` still is one."""
    import os
    import secrets
    import signal
    import subprocess
    import sys

    sched, _ = trial
    names = [sched.experiment_name, sched.trial_name] if named else []
    api_token = secrets.token_urlsafe(16)
    env = {**os.environ, "CORRAL_DASHBOARD_TOKEN": api_token}
    proc = subprocess.Popen(
        [sys.executable, "-m", "corral.cli", "--fileroot", local_backend.fileroot,
         "dashboard", *names, "--port", "0"],
        stdout=subprocess.PIPE, text=True, env=env, preexec_fn=sigint_not_ignored,
    )  # fmt: skip
    try:
        first = proc.stdout.readline().strip()
        assert first.startswith("corral dashboard: http://127.0.0.1:"), first
        base = first.split(": ", 1)[1].split("#login=")[0]
        server = SimpleNamespace(port=int(base.rstrip("/").rsplit(":", 1)[1]))

        for path in ("/api/trials", "/api/trials?token=", f"/api/trials?token={api_token}"):
            _, r = _get(server, path, Authorization="Bearer ")
            assert r.status == 401, (path, r.status)
            _, r = _get(server, path, Cookie=f"corral_dash_{server.port}=")
            assert r.status == 401, (path, r.status)
        _, r = _get(server, "/api/trials", token=api_token)
        assert r.status == 200  # the real token still logs in
    finally:
        os.kill(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=10) == 130
        proc.stdout.close()


def test_corral_dashboard_needs_both_experiment_and_trial(tmp_path):
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "corral.cli", "--fileroot", str(tmp_path), "dashboard", "exp"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and "EXPERIMENT and TRIAL" in done.stderr


def test_a_trial_without_stats_comes_from_name_resolve_with_its_log(local_backend, monkeypatch):
    import os

    from corral.discovery import FileNameResolve

    monkeypatch.setenv("CORRAL_STATS", "0")
    sched = local_backend.scheduler()
    nr = FileNameResolve(os.path.join(local_backend.fileroot, "name_resolve"))
    source = TrialSource(local_backend.fileroot, max_age=600, name_resolve=nr)
    server = Dashboard(source, port=0).serve_in_thread()
    try:
        (wid,) = sched.create_workers(Job(role="solo", replicas=1))
        _, r = _get(server, "/api/trials", token=server.token)
        (snap,) = [t for t in json.load(r) if t["trial"] == sched.trial_name]
        assert snap["status"] == "registered"
        assert [(w["id"], w["pid"]) for w in snap["workers"]] == [
            (wid, sched.get_workers("solo")[0].pid)
        ]
        query = f"experiment={sched.experiment_name}&trial={sched.trial_name}&worker={wid}"
        conn, r = _get(server, f"/logs?{query}", token=server.token)
        (tail,) = _events(r, "lines")
        assert any(f"corral worker {wid}" in line for line in tail)
        conn.close()
    finally:
        server.close()
        sched.close()
