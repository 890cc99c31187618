"""The dashboard's credentials (issue 25, attack 5).

Before: the token became a cookie, ``corral_dash_<port>``; browsers do not isolate cookies
by port, so a real Chromium that opened the dashboard and then a page of another user's
server on another 127.0.0.1 port sent that server the cookie, and replaying it returned
trial snapshots and worker logs. ``corral dashboard EXP TRIAL`` also took the trial secret
as a token (and would have put it in the cookie). Now: no cookie, a one-time login code in
the address's fragment, a per-tab session token in an ``Authorization`` header, all bound
to one run of the server; the trial secret is never a dashboard credential.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from corral import Job
from corral.observe.dashboard import Dashboard
from corral.observe.source import TrialSource
from tests.conformance.harness import require_service, sigint_not_ignored
from tests.security.support import MALLORY, unix_user
from tests.support.browser import Browser, BrowserError, chromium_path

SYSTEM_PYTHON = "/usr/bin/python3"
# Another user's web server: records every request head it gets, serves a plain page.
SPY = r"""
import http.server, json, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        print(json.dumps({"path": self.path, "head": str(self.headers)}), flush=True)
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(b"<html><body><p id=spy>another user's page</p></body></html>")
    def log_message(self, *args):
        pass
server = http.server.HTTPServer(("127.0.0.1", 0), H)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


@pytest.fixture
def browser():
    if chromium_path() is None:
        require_service("chromium", "no chromium on PATH (apt-get install chromium)")
    try:
        b = Browser()
    except BrowserError as exc:
        require_service("chromium", str(exc))
    yield b
    b.close()


@pytest.fixture
def trial(local_backend):
    sched = local_backend.scheduler()
    sched.create_workers(Job(role="w", replicas=1))
    yield sched
    sched.close()


def _request(port: int, path: str, token: str = "", method: str = "GET", **headers):
    if token:
        headers["Authorization"] = f"Bearer {token}"
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        conn.request(method, path, headers=headers)
        reply = conn.getresponse()
        return reply.status, reply.read()
    finally:
        conn.close()


def _login(dash: Dashboard) -> str:
    status, body = _request(dash.port, "/api/session", dash.url.split("#login=")[1], "POST")
    assert status == 200, body
    return json.loads(body)["session"]


def test_another_users_server_on_another_port_gets_no_dashboard_credential(
    local_backend, trial, browser
) -> None:
    dash = Dashboard(TrialSource(local_backend.fileroot, max_age=600), port=0).serve_in_thread()
    unix_user(MALLORY)
    spy = subprocess.Popen(
        ["runuser", "-u", MALLORY, "--", SYSTEM_PYTHON, "-c", SPY],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        spy_port = int(spy.stdout.readline())
        browser.goto(dash.url)
        browser.wait_for(
            "document.getElementById('conn').dataset.state === 'live'", what="a live page"
        )
        assert "login" not in browser.eval("location.href")  # spent, out of the address
        session = browser.eval("sessionStorage.getItem('corral-session')")
        assert session
        browser.goto(f"http://127.0.0.1:{spy_port}/page")
        browser.wait_for("document.getElementById('spy') !== null", what="the spy's page")
        spy.send_signal(signal.SIGTERM)
        seen = spy.communicate(timeout=10)[0]
        heads = [json.loads(line)["head"] for line in seen.splitlines() if line.startswith("{")]
        assert heads, seen
        for head in heads:
            assert "cookie" not in head.lower() and "authorization" not in head.lower(), head
            assert session not in head and dash.token not in head
        browser.goto(dash.base_url)
        assert browser.eval("document.cookie") == ""
        # what the spy might have learnt is refused anyway: a spent login code
        code = dash.url.split("#login=")[1]
        assert _request(dash.port, "/api/session", code, "POST")[0] == 401
        assert _request(dash.port, "/api/trials", session)[0] == 200  # the tab's own token
    finally:
        if spy.poll() is None:
            spy.kill()
            spy.wait()
        dash.close()


def test_a_session_replayed_after_the_dashboard_restarts_is_refused(local_backend) -> None:
    source = TrialSource(local_backend.fileroot, max_age=600)
    fixed = "token-chosen-by-the-operator-0123"  # CORRAL_DASHBOARD_TOKEN: the same both times
    first = Dashboard(source, port=0, token=fixed).serve_in_thread()
    port = first.port
    session = _login(first)
    code = first.url.split("#login=")[1]
    assert _request(port, "/api/trials", session)[0] == 200
    first.close()
    second = Dashboard(source, port=port, token=fixed).serve_in_thread()
    try:
        assert _request(port, "/api/trials", session)[0] == 401
        assert _request(port, "/api/session", code, "POST")[0] == 401
        assert _request(port, "/api/trials", Cookie=f"corral_dash_{port}={fixed}")[0] == 401
    finally:
        second.close()


def test_the_trial_secret_is_never_in_a_dashboard_url_log_or_credential(
    local_backend, trial
) -> None:
    sched = trial
    proc = subprocess.Popen(
        [sys.executable, "-m", "corral.cli", "--fileroot", local_backend.fileroot,
         "dashboard", sched.experiment_name, sched.trial_name, "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=sigint_not_ignored,
    )  # fmt: skip
    try:
        first = proc.stdout.readline()
        url = first.split(": ", 1)[1].split()[0]
        port = int(url.split(":")[2].split("/")[0])
        assert sched.secret not in url
        assert _request(port, "/api/trials", sched.secret)[0] == 401
        assert _request(port, "/api/session", sched.secret, "POST")[0] == 401
        assert _request(port, f"/api/trials?token={sched.secret}")[0] == 401
        time.sleep(1)
    finally:
        os.kill(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    assert sched.secret not in first + out + err
