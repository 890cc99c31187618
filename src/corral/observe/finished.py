"""Roles and workers that are gone stay in the live view with their final figures.

``delete_workers`` takes a role out of the scheduler, so a snapshot built from the
scheduler alone has no row for it: a finished trial's dashboard would be empty. The
builder remembers the last rows of every role it published and, once a role is gone,
keeps publishing them as final: every worker with its last state ("stopped" for a
worker deleted cleanly, its failure otherwise), exit code, call counts, how long it ran
and when it ended. The stats file keeps them after the trial closes, until it is removed.
"""

from __future__ import annotations

FINAL_STATES = ("failed", "exited", "stopped")


def _final_calls(calls: dict | None) -> dict | None:
    if calls is None:
        return None
    return {**calls, "in_flight": 0, "rate": 0.0, "p50_ms": None, "p99_ms": None}


def final_worker(row: dict, ended: float, calls: dict | None) -> dict:
    """``row`` as the last word on its worker: the role was deleted at ``ended``."""
    out = {k: v for k, v in row.items() if k not in ("cpu_percent", "rss_bytes", "processes")}
    out.pop("gpu_util", None)
    out.pop("gpu_mem_bytes", None)
    if out.get("state") not in FINAL_STATES:
        out.update(state="stopped", reason="deleted by delete_workers")
    out["ended"] = out.get("died_at") or ended
    if out.get("started"):
        out["duration"] = round(out["ended"] - out["started"], 3)
    out["calls"] = _final_calls(calls if calls is not None else out.get("calls"))
    return out


def final_role(row: dict, ended: float, calls: dict | None) -> dict:
    out = dict(row)
    out.update(state="deleted", ended=ended)
    out["calls"] = _final_calls(calls if calls is not None else row.get("calls"))
    out["methods"] = {m: _final_calls(f) for m, f in (row.get("methods") or {}).items()}
    return out


class FinishedRoles:
    """The last published rows of each role, and since when each deleted role is gone."""

    def __init__(self) -> None:
        self.last: dict[str, tuple[dict, list[dict]]] = {}
        self.gone: dict[str, float] = {}

    def merge(
        self,
        roles: list[dict],
        workers: list[dict],
        now: float,
        role_calls: dict[str, dict],
        worker_calls: dict[str, dict],
    ) -> tuple[list[dict], list[dict]]:
        """``roles``/``workers`` (the live rows) plus the final rows of deleted roles.
        ``role_calls``/``worker_calls``: the current totals (counted up to the end)."""
        by_role: dict[str, list[dict]] = {}
        for row in workers:
            by_role.setdefault(row["role"], []).append(row)
        live = set()
        for row in roles:
            live.add(row["role"])
            self.last[row["role"]] = (row, by_role.get(row["role"], []))
            self.gone.pop(row["role"], None)
        roles, workers = list(roles), list(workers)
        for role, (row, rows) in self.last.items():
            if role in live:
                continue
            ended = self.gone.setdefault(role, now)
            roles.append(final_role(row, ended, role_calls.get(role)))
            workers.extend(final_worker(w, ended, worker_calls.get(w["id"])) for w in rows)
        return roles, workers
