"""Prometheus text exposition of a trial's snapshot, and the small server for it.

Off by default; the controller serves it when ``CORRAL_METRICS_PORT`` is set (bound to
``CORRAL_METRICS_HOST``, default 127.0.0.1). It carries numbers only — no addresses,
secrets or log lines — and only to a scraper that sends ``Authorization: Bearer <token>``
(Prometheus: ``authorization: {credentials_file: ...}``), so that other users of the host
cannot read a trial's call figures.

The server runs in the controller, so it has a budget of its own (``corral.observe.
http_guard``): at most ``MAX_WAITING`` connections wait for their head (10 s each, no
thread), a request without the token is answered ``401`` without a thread, and at most
``MAX_HANDLERS`` authorized requests are served at once. Whatever peers do, it never holds
more than about 40 descriptors and 6 threads of the controller, so its lease and its
connections to the workers are never short of either.
"""

from __future__ import annotations

import hmac
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler

from corral.observe.http_guard import PRIVATE, GuardedHTTPServer

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MAX_WAITING = 32
MAX_HANDLERS = 4


def _label(value: object) -> str:
    text = str(value)
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(**labels: object) -> str:
    return "{" + ",".join(f'{k}="{_label(v)}"' for k, v in labels.items()) + "}"


def render(snapshot: dict | None) -> str:
    """The snapshot as Prometheus text format 0.0.4."""
    lines: list[str] = []
    if not snapshot:
        return ""
    base = {"experiment": snapshot["experiment"], "trial": snapshot["trial"]}

    def family(name: str, kind: str, help_text: str, samples: list[tuple[dict, float]]) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            lines.append(f"{name}{_labels(**base, **labels)} {value}")

    roles = snapshot["roles"]
    family(
        "corral_calls_total",
        "counter",
        "Engine calls completed, per role.",
        [({"role": r["role"]}, r["calls"]["total"]) for r in roles],
    )
    family(
        "corral_call_errors_total",
        "counter",
        "Engine calls that raised, per role.",
        [({"role": r["role"]}, r["calls"]["errors"]) for r in roles],
    )
    family(
        "corral_calls_in_flight",
        "gauge",
        "Engine calls sent and not yet answered.",
        [({"role": r["role"]}, r["calls"]["in_flight"]) for r in roles],
    )
    family(
        "corral_call_rate",
        "gauge",
        "Engine calls per second over the last second.",
        [({"role": r["role"]}, r["calls"]["rate"]) for r in roles],
    )
    family(
        "corral_call_latency_seconds",
        "gauge",
        "Engine call latency quantiles over the last second with calls.",
        [
            ({"role": r["role"], "quantile": q}, r["calls"][f"p{q[2:]}_ms"] / 1e3)
            for r in roles
            for q in ("0.50", "0.99")
            if r["calls"][f"p{q[2:]}_ms"] is not None  # no calls in the last second
        ],
    )
    per_worker_and_method(snapshot, family)
    workers = snapshot["workers"]
    family(
        "corral_worker_up",
        "gauge",
        "1 if the worker runs, 0 if it failed, exited or starts.",
        [({"worker": w["id"], "state": w["state"]}, int(w["state"] == "running")) for w in workers],
    )
    family(
        "corral_worker_restarts_total",
        "counter",
        "Restarts of the worker's replica.",
        [({"worker": w["id"]}, w["restarts"]) for w in workers],
    )
    family(
        "corral_worker_exit_code",
        "gauge",
        "Exit code of a worker that ended.",
        [({"worker": w["id"]}, w["exit_code"]) for w in workers if w["exit_code"] is not None],
    )
    return "\n".join(lines) + "\n"  # fmt: skip


def per_worker_and_method(snapshot: dict, family: Callable) -> None:
    """Call figures per worker and per method, and each worker's CPU, memory and GPU
    use where measured (corral.observe.resources)."""
    calls = [(w["id"], w["calls"]) for w in snapshot["workers"] if w.get("calls")]
    methods = [
        ({"role": r["role"], "method": m}, k)
        for r in snapshot["roles"]
        for m, k in sorted((r.get("methods") or {}).items())
    ]
    for suffix, key, kind, what in (
        ("calls_total", "total", "counter", "Engine calls completed"),
        ("call_errors_total", "errors", "counter", "Engine calls that raised"),
    ):
        family(f"corral_worker_{suffix}", kind, f"{what}, per worker.",
               [({"worker": wid}, k[key]) for wid, k in calls])  # fmt: skip
        family(f"corral_method_{suffix}", kind, f"{what}, per role and method.",
               [(labels, k[key]) for labels, k in methods])  # fmt: skip
    quantiles = (("0.50", "p50_ms"), ("0.99", "p99_ms"))
    family("corral_worker_call_latency_seconds", "gauge",
           "Engine call latency quantiles over the last second, per worker.",
           [({"worker": wid, "quantile": q}, k[f] / 1e3) for wid, k in calls
            for q, f in quantiles if k[f] is not None])  # fmt: skip
    family("corral_method_call_latency_seconds", "gauge",
           "Engine call latency quantiles over the last second, per role and method.",
           [({**labels, "quantile": q}, k[f] / 1e3) for labels, k in methods
            for q, f in quantiles if k[f] is not None])  # fmt: skip
    for name, key, scale, what in (
        ("corral_worker_cpu_percent", "cpu_percent", 1, "CPU use of the worker's process tree (%)."),
        ("corral_worker_rss_bytes", "rss_bytes", 1, "Resident memory of the worker's process tree."),
        ("corral_worker_gpu_utilization_percent", "gpu_util", 1, "Mean utilisation of its GPUs."),
        ("corral_worker_gpu_memory_bytes", "gpu_mem_bytes", 1, "Memory used on its GPUs."),
    ):  # fmt: skip
        samples = [({"worker": w["id"]}, w[key] * scale) for w in snapshot["workers"]
                   if w.get(key) is not None]  # fmt: skip
        if samples:
            family(name, "gauge", what, samples)


class MetricsServer:
    """``GET /metrics`` on a daemon thread for requests bearing ``token``; ``source()``
    returns the latest snapshot."""

    def __init__(
        self,
        source: Callable[[], dict | None],
        token: str,
        host: str = "127.0.0.1",
        port: int = 0,
    ):
        expected = f"Bearer {token}".encode()

        class Handler(BaseHTTPRequestHandler):
            timeout = 10  # each write of the reply (the head was read by the gate)

            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                offered = (self.headers.get("Authorization") or "").encode()
                if not hmac.compare_digest(offered, expected):
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Bearer realm="corral"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404, "only /metrics is served here")
                    return
                body = render(source()).encode()
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        def judge(method: str, path: str, headers: dict) -> str | None:
            offered = headers.get("authorization", "").encode()
            return PRIVATE if hmac.compare_digest(offered, expected) else None

        self.httpd = GuardedHTTPServer(
            (host, port), Handler, judge, name="corral-metrics",
            www_authenticate='Bearer realm="corral"', max_waiting=MAX_WAITING,
            max_waiting_per_peer=MAX_WAITING // 2, max_public=1, max_private=MAX_HANDLERS,
        )  # fmt: skip
        self.url = f"http://{host}:{self.httpd.server_address[1]}/metrics"
        self.token_file: str | None = None  # where the scraper reads the token, if written
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, name="corral-metrics", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
