"""``corral dashboard``: a small web page with a live view of every trial it can see.

Standard library handlers (``http.server``) behind the gate (``corral.observe.http_guard``:
no thread per waiting connection, a whole-head deadline, caps per peer and in total); live
updates are server-sent events (``/events`` for trial snapshots, ``/logs`` for one
worker's log). The page, script and style (``corral/observe/static``, no CDN, a strict
Content-Security-Policy) are public; every data request needs ``Authorization: Bearer``
with a session token of this server (``corral.observe.dash_auth``: a one-time login code
in the printed address, no cookie, never the trial secret).
"""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler
from importlib import resources
from urllib.parse import parse_qs, urlsplit

from corral.errors import ConfigError
from corral.observe import inert
from corral.observe.dash_auth import DashboardAuth, bearer
from corral.observe.follow import follow_lines
from corral.observe.http_guard import PRIVATE, PUBLIC, GuardedHTTPServer
from corral.observe.source import TrialSource

STATIC = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/static/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
    "/static/dashboard.css": ("dashboard.css", "text/css; charset=utf-8"),
    "/static/session.js": ("session.js", "text/javascript; charset=utf-8"),
}
SESSION_PATH = "/api/session"
#: connections waiting for their head, and authorized requests served at once (streams
#: included): the dashboard's budget of descriptors and threads
MAX_WAITING = 128
MAX_STREAMS = 32
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
DEFAULT_PORT = 8470
#: seconds any one write to a client may stall (the head was read, whole, by the gate
#: within its 10 s deadline)
IO_TIMEOUT = 30.0


def static_file(name: str) -> bytes:
    return resources.files("corral.observe").joinpath("static", name).read_bytes()


class Dashboard:
    """The server. ``url`` (with the token) is what to open; ``close()`` stops it."""

    def __init__(
        self,
        source: TrialSource,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        token: str | None = None,
        interval: float = 1.0,
    ):
        self.source = source
        self.auth = DashboardAuth(token)
        self.token = self.auth.token  # the API token (Authorization: Bearer), for scripts
        self.interval = interval
        self.stop = threading.Event()
        try:
            self.httpd = GuardedHTTPServer(
                (host, port), _handler(self), self._judge, name="corral-dashboard",
                unauthorized=UNAUTHORIZED, max_waiting=MAX_WAITING,
                max_waiting_per_peer=MAX_WAITING // 2, max_public=8, max_private=MAX_STREAMS,
            )  # fmt: skip
        except (OSError, OverflowError) as exc:
            reason = getattr(exc, "strerror", None) or str(exc)
            raise ConfigError(
                "--host/--port", f"{host}:{port}", f"cannot listen there ({reason}); use a "
                "local address and a free port 1-65535, or port 0 for any free one"
            ) from None  # fmt: skip
        self.port = self.httpd.server_address[1]
        shown = "127.0.0.1" if host in ("", "0.0.0.0") else host
        self.base_url = f"http://{shown}:{self.port}/"
        self.url = self.login_url()
        self._thread: threading.Thread | None = None

    def login_url(self) -> str:
        """An address that signs one browser tab in, once (a fresh one-time code)."""
        return f"{self.base_url}#login={self.auth.new_login()}"

    def authorized(self, authorization: str | None) -> bool:
        return self.auth.authorized(authorization)

    def _judge(self, method: str, target: str, headers: dict) -> str | None:
        """In the gate's thread, before any handler thread: public, private or refused."""
        path = urlsplit(target).path
        if method == "GET" and path in STATIC or method == "POST" and path == SESSION_PATH:
            return PUBLIC
        return PRIVATE if self.auth.authorized(headers.get("authorization")) else None

    def serve_in_thread(self) -> Dashboard:
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, name="corral-dashboard", daemon=True
        )
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self.httpd.serve_forever()

    def close(self) -> None:
        self.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()


UNAUTHORIZED = (
    b"corral dashboard: open the address printed at start (it ends in #login=...), "
    b"or send Authorization: Bearer <CORRAL_DASHBOARD_TOKEN>\n"
)


def _handler(dash: Dashboard) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "corral-dashboard"
        timeout = IO_TIMEOUT

        def log_message(self, *args: object) -> None:
            pass

        # ------------------------------------------------------------ helpers
        def _send(self, status: int, body: bytes, content_type: str, **headers: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for name, value in {**SECURITY_HEADERS, **headers}.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def _json(self, value: object, status: int = 200) -> None:
            self._send(status, json.dumps(value).encode(), "application/json")

        def _start_events(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            for name, value in SECURITY_HEADERS.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(b"retry: 2000\n\n")
            self.wfile.flush()

        def _event(self, name: str, data: object) -> None:
            self.wfile.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
            self.wfile.flush()

        # ------------------------------------------------------------ routes
        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            """``/api/session``: spend a one-time login code for a session token."""
            if urlsplit(self.path).path != SESSION_PATH:
                self._send(404, b"not found\n", "text/plain")
                return
            session = dash.auth.exchange(bearer(self.headers.get("Authorization")))
            if session is None:
                self._send(401, UNAUTHORIZED, "text/plain; charset=utf-8")
                return
            self._json({"session": session})

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            url = urlsplit(self.path)
            query = {k: v[0] for k, v in parse_qs(url.query).items()}
            if url.path in STATIC:
                name, content_type = STATIC[url.path]
                self._send(200, static_file(name), content_type)
                return
            if not dash.authorized(self.headers.get("Authorization")):
                self._send(401, UNAUTHORIZED, "text/plain; charset=utf-8")
                return
            try:
                if url.path == "/api/trials":
                    self._json(inert.deep(dash.source.trials()))
                elif url.path == "/events":
                    self._stream_trials()
                elif url.path == "/logs":
                    self._stream_log(query)
                else:
                    self._send(404, b"not found\n", "text/plain")
            except ConfigError as exc:
                self._json({"error": str(exc)}, 400)
            except (BrokenPipeError, ConnectionResetError):
                pass

        def _stream_trials(self) -> None:
            self._start_events()
            while not dash.stop.is_set():
                self._event("trials", inert.deep(dash.source.trials()))
                if dash.stop.wait(dash.interval):
                    break

        def _stream_log(self, query: dict) -> None:
            experiment, trial, worker = (
                query.get(k, "") for k in ("experiment", "trial", "worker")
            )
            path = dash.source.log_path(experiment, trial, worker)  # checks the names first
            self._start_events()
            waited = 0
            while path is None:  # a worker not (yet) in its trial's stats: wait for it
                if dash.stop.wait(0.5):
                    return
                waited += 1
                if waited % 20 == 0:
                    self._keep_alive()
                path = dash.source.log_path(experiment, trial, worker)
            self._event("path", path)
            idle = 0
            for lines in follow_lines(path, dash.stop, match=query.get("q") or None):
                if lines:
                    self._event("lines", [inert.lines(line) for line in lines])
                    idle = 0
                else:
                    idle += 1
                    if idle % 40 == 0:  # ~10 s: writing finds a client that left
                        self._keep_alive()

        def _keep_alive(self) -> None:
            self.wfile.write(b": keep-alive\n\n")
            self.wfile.flush()

    return Handler


def run_dashboard(
    source: TrialSource,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    print_fn=print,
) -> None:
    """Serve until Ctrl-C (``corral dashboard``). The address printed signs one browser
    tab in, once; scripts send ``Authorization: Bearer $CORRAL_DASHBOARD_TOKEN``."""
    token = os.environ.get("CORRAL_DASHBOARD_TOKEN") or None
    dash = Dashboard(source, host, port, token=token)
    print_fn(f"corral dashboard: {dash.url}  (signs in one browser tab, once)")
    if host not in ("127.0.0.1", "localhost", "::1"):
        print_fn(
            f"warning: listening on {host}: anyone who can reach it and has the token sees the logs"
        )
    print_fn(f"reading trials under {source.fileroot}; Ctrl-C stops it")
    try:
        dash.serve_forever()
    finally:
        dash.close()
