"""The controller's stats publisher: once a second it samples the call statistics,
builds a snapshot and writes it to ``<fileroot>/secrets/<experiment>/<trial>/stats.json``
(0600, in the trial's 0700 directory, replaced atomically), where ``corral dashboard``
and ``corral top`` read it. Optionally it also serves Prometheus text (off by default).
"""

from __future__ import annotations

import json
import logging
import os
import threading

from corral.observe.call_stats import CallStats, NullCallStats
from corral.observe.snapshot import ControllerView, SnapshotBuilder
from corral.safedirs import make_private_subdir

log = logging.getLogger("corral")
INTERVAL_SECONDS = 1.0
METRICS_ENV = "CORRAL_METRICS_PORT"  # set to a port (0: any free one) to serve Prometheus text
METRICS_HOST_ENV = "CORRAL_METRICS_HOST"  # default 127.0.0.1
METRICS_TOKEN_ENV = "CORRAL_METRICS_TOKEN"  # default: a fresh token in metrics.token (0600)
STATS_ENV = "CORRAL_STATS"  # "0" turns recording and the stats file off


def stats_enabled() -> bool:
    return os.environ.get(STATS_ENV, "1") != "0"


def make_call_stats() -> CallStats:
    return CallStats() if stats_enabled() else NullCallStats()


def write_private(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` as a 0600 file, atomically (readers never see half)."""
    make_private_subdir(os.path.dirname(path))
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)


class StatsPublisher:
    """One daemon thread per scheduler, started with its first workers."""

    def __init__(
        self,
        view: ControllerView,
        calls: CallStats,
        stats_file: str,
        metrics_token_file: str,
        interval: float = INTERVAL_SECONDS,
    ):
        self.calls = calls
        self.interval = interval
        self.path = stats_file  # in the trial's private directory
        self.token_file = metrics_token_file
        self.builder = SnapshotBuilder(view)
        self.latest: dict | None = None
        self.metrics_server = None
        self._stop: threading.Event | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        if not self.calls.enabled or self._thread is not None:
            return
        port = os.environ.get(METRICS_ENV)
        if port and self.metrics_server is None:
            self.metrics_server = _metrics_server(port, lambda: self.latest, self.token_file)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(self._stop,), name="corral-stats", daemon=True
        )
        self._thread.start()

    def _run(self, stop: threading.Event) -> None:
        while True:
            self.publish()
            if stop.wait(self.interval):
                return

    def publish(self, closed: bool = False) -> dict | None:
        with self._lock:
            try:
                snap = self.builder.build(self.calls.sample_all(), closed=closed)
                if self.metrics_server is not None:
                    snap["metrics_url"] = self.metrics_server.url
                    snap["metrics_token_file"] = self.metrics_server.token_file
                self.latest = snap
                write_private(self.path, json.dumps(snap, separators=(",", ":")).encode())
                return snap
            except Exception as exc:  # never let the view break the trial
                log.debug("publishing stats failed: %s", exc)
                return None

    def before_delete(self) -> None:
        """Publish now, so the final table of the roles about to be deleted holds every
        worker with its last figures (see corral.observe.finished)."""
        if self._thread is not None:
            self.publish()

    def stop(self) -> None:
        """Stop the thread and write a last snapshot marked closed."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=5)
        self._thread = None
        self.publish(closed=True)
        if self.metrics_server is not None:
            self.metrics_server.close()
            self.metrics_server = None


def _metrics_token(token_file: str) -> str:
    """The scrape token: ``CORRAL_METRICS_TOKEN`` if set, else a fresh one; either way
    written to ``token_file`` (0600) for the scraper's ``credentials_file``."""
    import secrets

    from corral.errors import ConfigError

    token = os.environ.get(METRICS_TOKEN_ENV)
    if token is not None and (len(token) < 16 or not token.isprintable() or " " in token):
        raise ConfigError(
            METRICS_TOKEN_ENV,
            "<hidden>",
            "use at least 16 printable characters without spaces, or unset it for a fresh token",
        )
    token = token or secrets.token_urlsafe(24)
    write_private(token_file, token.encode())
    return token


def _metrics_server(port: str, source, token_file: str):
    """The Prometheus server named by the environment, or a ConfigError naming it."""
    from corral.errors import ConfigError
    from corral.observe.prometheus import MetricsServer

    if not port.isdigit() or int(port) > 65535:
        raise ConfigError(METRICS_ENV, port, "set a port number 0-65535 (0: any free port)")
    host = os.environ.get(METRICS_HOST_ENV, "127.0.0.1")
    token = _metrics_token(token_file)
    try:
        server = MetricsServer(source, token, host, int(port))
        server.token_file = token_file
        return server
    except OSError as exc:
        raise ConfigError(
            f"{METRICS_ENV}/{METRICS_HOST_ENV}",
            f"{host}:{port}",
            f"cannot listen there ({exc.strerror}); pick a free port or 0",
        ) from None
