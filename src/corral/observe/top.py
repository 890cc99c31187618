"""``corral top``: the dashboard's tables in the terminal, drawn with ``rich``.

Every string shown comes from workers or records, so it goes through ``corral.observe.
inert`` first (no escape sequence reaches the terminal) and into rich as ``Text`` (never as
markup); a trial whose snapshot has bad values is shown as unreadable instead of ending
``top``."""

from __future__ import annotations

import time

from corral.observe import inert
from corral.observe.source import TrialSource

STATE_STYLE = {
    "running": "green",
    "failed": "bold red",
    "starting": "yellow",
    "restarting": "yellow",
    "exited": "dim",
    "registered": "cyan",
}
STATUS_STYLE = {"live": "green", "ended": "dim", "unresponsive": "bold red", "registered": "cyan"}


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    seconds = int(max(0, seconds))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    return f"{minutes}m {secs}s" if minutes else f"{secs}s"


def _placement(w: dict) -> str:
    pid = w.get("pid")
    if w.get("backend_id") and not w.get("forked_from") and w["backend"] in ("slurm", "ray"):
        prefix = "job " if w["backend"] == "slurm" else ""
        return f"{prefix}{w['backend_id']} pid {pid or ''}".strip()
    return f"pid {pid}" if pid else ""


def _ms(value: float | None) -> str:
    """A latency, or "–" when there were no calls in the window."""
    return "–" if value is None else f"{value:.3f}"


def _bytes(n: int | None) -> str:
    if n is None:
        return ""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def _clock(unix: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(unix)) if unix else ""


def _use(w: dict) -> str:
    """CPU%, RSS (and GPU) of the worker's process tree, where measured."""
    if w.get("cpu_percent") is None:
        return ""
    text = f"{w['cpu_percent']:.0f}% {_bytes(w.get('rss_bytes'))}"
    if w.get("gpu_util") is not None:
        text += f" gpu {w['gpu_util']:.0f}% {_bytes(w.get('gpu_mem_bytes'))}"
    return text


def methods_table(t: dict):
    """Calls per method of each role (None when no method was called)."""
    from rich.table import Table
    from rich.text import Text

    rows = [
        (r["role"], m, k) for r in t["roles"] for m, k in sorted((r.get("methods") or {}).items())
    ]
    if not rows:
        return None
    table = Table(box=None, pad_edge=False)
    for name in ("ROLE", "METHOD", "CALLS", "ERRORS", "CALLS/S", "P50 MS", "P99 MS"):
        table.add_column(name, justify="left" if name in ("ROLE", "METHOD") else "right")
    for role, method, k in rows:
        table.add_row(Text(str(role)), Text(str(method)), str(k["total"]), str(k["errors"]), f"{k['rate']:.1f}",
                      _ms(k["p50_ms"]), _ms(k["p99_ms"]))  # fmt: skip
    return table


def render(trials: list[dict]):
    """One renderable (a rich Group): per trial, its roles table and workers table."""
    from rich.console import Group
    from rich.text import Text

    parts: list = []
    if not trials:
        return Text("no trials found (is a controller running with this --fileroot?)")
    for t in inert.deep(trials):
        try:
            parts += _trial(t)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            name = f"{t.get('experiment')} / {t.get('trial')}" if isinstance(t, dict) else "?"
            parts.append(Text(inert.text(f"{name}: unreadable snapshot ({exc!r})"), "red"))
    return Group(*parts)


def _trial(t: dict) -> list:
    from rich.table import Table
    from rich.text import Text

    def row(table: Table, *cells: object) -> None:  # plain text, never markup
        table.add_row(*(c if isinstance(c, Text) else Text(str(c)) for c in cells))

    c = t["controller"]
    title = Text.assemble(
        (f"{t['experiment']} / {t['trial']}", "bold"),
        "  ",
        (t["status"], STATUS_STYLE.get(t["status"], "")),
        f"  {t['backend'] or 'backend unknown'} · controller pid {c['pid']} on {c['host']}"
        + (f" · up {_duration(t['time'] - c['started'])}" if c.get("started") else "")
        + (" · no stats file: workers from name-resolve" if t["status"] == "registered" else ""),
    )
    roles = Table(expand=False, box=None, pad_edge=False)
    for name in ("ROLE", "KIND", "REPLICAS", "CALLS", "ERRORS", "IN FLIGHT", "CALLS/S",
                 "P50 MS", "P99 MS"):  # fmt: skip
        roles.add_column(name, justify="left" if name in ("ROLE", "KIND") else "right")
    for r in t["roles"]:
        k = r["calls"]
        row(
            roles,
            r["role"],
            f"{r['kind']} on {r['target']}" if r.get("target") else r["kind"],
            str(r["replicas"]),
            str(k["total"]),
            str(k["errors"]),
            str(k["in_flight"]),
            f"{k['rate']:.1f}",
            _ms(k["p50_ms"]),
            _ms(k["p99_ms"]),
        )
    workers = Table(box=None, pad_edge=False)
    for name in ("WORKER", "BACKEND", "HOST", "GPUS", "PID/JOB/ACTOR", "STATE", "UPTIME",
                 "RESTARTS", "EXIT", "CALLS", "ERRORS", "P50 MS", "CPU/MEM", "ENDED"):  # fmt: skip
        right = ("RESTARTS", "EXIT", "CALLS", "ERRORS", "P50 MS")
        workers.add_column(name, justify="right" if name in right else "left")
    failures = []
    for w in t["workers"]:
        running = w["state"] in ("running", "registered") and w.get("started")
        row(
            workers,
            w["id"] + (f" (on {w['forked_from']})" if w.get("forked_from") else ""),
            w["backend"],
            w.get("host") or "",
            "" if w.get("gpus") is None else (w["gpus"] or "none"),
            _placement(w),
            Text(w["state"], STATE_STYLE.get(w["state"], "")),
            _duration(t["time"] - w["started"]) if running else _ran(w),
            str(w["restarts"]),
            "" if w.get("exit_code") is None else str(w["exit_code"]),
            *_worker_calls(w.get("calls")),
            _use(w),
            _clock(w.get("ended") or w.get("died_at")),
        )
        if w["state"] == "failed":
            tail = "\n".join((w.get("log_tail") or "").splitlines()[-5:])
            failures.append(
                Text.assemble(
                    (f"{w['id']} failed", "bold red"),
                    f" exit code {w.get('exit_code')}",
                    f" at {_clock(w.get('died_at') or w.get('ended'))}"
                    if w.get("died_at") or w.get("ended")
                    else "",
                    f": {w.get('reason') or ''}\n",
                    (tail, "dim"),
                )
            )
    methods = methods_table(t)
    if t.get("records_note"):  # records in name-resolve not signed with the trial's secret
        title = Text.assemble(title, "\n", (str(t["records_note"]), "yellow"))
    return [title, roles, *([Text(""), methods] if methods else []), Text(""), workers,
            *failures, Text("")]  # fmt: skip


def _ran(w: dict) -> str:
    """How long a finished worker ran."""
    return f"ran {_duration(w['duration'])}" if w.get("duration") is not None else ""


def _worker_calls(k: dict | None) -> tuple[str, str, str]:
    if not k:
        return "", "", ""
    return str(k["total"]), str(k["errors"]), _ms(k["p50_ms"])


def run_top(
    source: TrialSource,
    once: bool = False,
    interval: float = 1.0,
    count: int | None = None,
    console=None,
) -> int:
    """Draw the tables: once, ``count`` times, or until Ctrl-C. On a terminal the table is
    redrawn in place; otherwise (a pipe, a log) each refresh is printed below the last,
    like ``top -b``."""
    from rich.console import Console
    from rich.live import Live

    console = console or Console()
    if once:
        count = 1
    if not console.is_terminal:
        shown = 0
        while count is None or shown < count:
            if shown:
                time.sleep(interval)
            console.print(render(source.trials()))
            shown += 1
        return 0
    with Live(render(source.trials()), console=console, screen=False, auto_refresh=False) as live:
        shown = 1
        while count is None or shown < count:
            time.sleep(interval)
            live.update(render(source.trials()), refresh=True)
            shown += 1
    return 0
