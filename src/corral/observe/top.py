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
            f"{k['p50_ms']:.3f}",
            f"{k['p99_ms']:.3f}",
        )
    workers = Table(box=None, pad_edge=False)
    for name in ("WORKER", "BACKEND", "HOST", "GPUS", "PID/JOB/ACTOR", "STATE", "UPTIME",
                 "RESTARTS", "EXIT"):  # fmt: skip
        workers.add_column(name, justify="right" if name in ("RESTARTS", "EXIT") else "left")
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
            _duration(t["time"] - w["started"]) if running else "",
            str(w["restarts"]),
            "" if w.get("exit_code") is None else str(w["exit_code"]),
        )
        if w["state"] == "failed":
            tail = "\n".join((w.get("log_tail") or "").splitlines()[-5:])
            failures.append(
                Text.assemble(
                    (f"{w['id']} failed", "bold red"),
                    f" exit code {w.get('exit_code')}: {w.get('reason') or ''}\n",
                    (tail, "dim"),
                )
            )
    return [title, roles, Text(""), workers, *failures, Text("")]


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
