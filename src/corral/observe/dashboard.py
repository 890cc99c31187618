"""``corral dashboard``: a small web page with a live view of every trial it can see.

Standard library only (``http.server``): one thread per request; live updates are
server-sent events (``/events`` for trial snapshots, ``/logs`` for one worker's log).
Every request needs the token printed at start (``?token=`` once, then a cookie), or the
trial's secret when one trial is named. The page, script and style ship in
``corral/observe/static`` (no CDN) and are served under a strict Content-Security-Policy.
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from urllib.parse import parse_qs, urlsplit

from corral.errors import ConfigError
from corral.observe.follow import follow_lines
from corral.observe.source import TrialSource

STATIC = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/static/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
    "/static/dashboard.css": ("dashboard.css", "text/css; charset=utf-8"),
}
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
DEFAULT_PORT = 8470
#: seconds a connection may take to send its request head (and any one read or write may
#: stall): a client that never finishes a request does not hold its thread for ever
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
        extra_secrets: tuple[str, ...] = (),
        interval: float = 1.0,
    ):
        self.source = source
        self.token = token or secrets.token_urlsafe(24)
        self._accepted = [self.token, *[s for s in extra_secrets if s]]
        self.interval = interval
        self.stop = threading.Event()
        try:
            self.httpd = ThreadingHTTPServer((host, port), _handler(self))
        except (OSError, OverflowError) as exc:
            reason = getattr(exc, "strerror", None) or str(exc)
            raise ConfigError(
                "--host/--port", f"{host}:{port}", f"cannot listen there ({reason}); use a "
                "local address and a free port 1-65535, or port 0 for any free one"
            ) from None  # fmt: skip
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.cookie = f"corral_dash_{self.port}"
        shown = "127.0.0.1" if host in ("", "0.0.0.0") else host
        self.base_url = f"http://{shown}:{self.port}/"
        self.url = f"{self.base_url}?token={self.token}"
        self._thread: threading.Thread | None = None

    def authorized(self, query_token: str | None, cookie_header: str | None) -> bool:
        offered = [query_token] if query_token else []
        for part in (cookie_header or "").split(";"):
            name, _, value = part.strip().partition("=")
            if name == self.cookie:
                offered.append(value)
        return any(
            hmac.compare_digest(o.encode(), a.encode()) for o in offered for a in self._accepted
        )

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
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            url = urlsplit(self.path)
            query = {k: v[0] for k, v in parse_qs(url.query).items()}
            if not dash.authorized(query.get("token"), self.headers.get("Cookie")):
                self._send(
                    401,
                    b"corral dashboard: open the address printed at start (it ends in ?token=...)\n",
                    "text/plain; charset=utf-8",
                )
                return
            if url.path == "/" and dash.authorized(query.get("token"), None):
                # the token goes into a cookie and out of the address bar
                cookie = f"{dash.cookie}={query['token']}; HttpOnly; SameSite=Strict; Path=/"
                self._send(303, b"", "text/plain", Location="/", **{"Set-Cookie": cookie})
                return
            try:
                if url.path in STATIC:
                    name, content_type = STATIC[url.path]
                    self._send(200, static_file(name), content_type)
                elif url.path == "/api/trials":
                    self._json(dash.source.trials())
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
                self._event("trials", dash.source.trials())
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
                    self._event("lines", lines)
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
    trial_secret: str | None = None,
    print_fn=print,
) -> None:
    """Serve until Ctrl-C (``corral dashboard``)."""
    token = os.environ.get("CORRAL_DASHBOARD_TOKEN") or None
    dash = Dashboard(source, host, port, token=token, extra_secrets=(trial_secret or "",))
    print_fn(f"corral dashboard: {dash.url}")
    if host not in ("127.0.0.1", "localhost", "::1"):
        print_fn(
            f"warning: listening on {host}: anyone who can reach it and has the token sees the logs"
        )
    print_fn(f"reading trials under {source.fileroot}; Ctrl-C stops it")
    try:
        dash.serve_forever()
    finally:
        dash.close()
