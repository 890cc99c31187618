"""What the controller knows about its trial, as one JSON-able dict (the stats file's
content): controller, roles with their call figures, and one row per worker."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from corral import name_resolve_keys
from corral.controller.health_monitor import WorkerHealth
from corral.controller.role_table import RoleState
from corral.discovery.base import NameResolve
from corral.launcher import WorkerExit
from corral.logs import replica_log_path, tail
from corral.observe.call_stats import CallFigures
from corral.observe.finished import FinishedRoles
from corral.observe.resources import ResourceSampler

SNAPSHOT_VERSION = 1
LOG_TAIL_LINES = 20


def started_at(generation: str) -> float | None:
    """A worker's start time (unix seconds), read from its generation ``<time>-<pid>``."""
    try:
        return float(generation.split("-", 1)[0])
    except (ValueError, AttributeError):
        return None


@dataclass(frozen=True, eq=False)
class ControllerView:
    """What observers read of a controller, and nothing else (built by
    corral.controller.wiring). ``roles`` is a live read-only mapping."""

    experiment: str
    trial: str
    backend: str
    log_dir: str
    name_resolve: NameResolve
    roles: Mapping[str, RoleState]
    deaths: Mapping[str, WorkerHealth]
    """worker id -> the health monitor's record of its death."""
    poll: Callable[[str], dict[int, WorkerExit]]
    """The backend's deaths of a role (``Launcher.poll``)."""
    pending_reason: Callable[[str], str | None]
    usage: Any = None
    """The workers' CPU/RSS records (``corral.observe.resources.usage_reader``), or None."""


class SnapshotBuilder:
    """Builds snapshots of one controller; caches what a worker published (its GPUs) per
    generation so name-resolve is read once per worker start, not once a second."""

    def __init__(self, view: ControllerView | None):
        self.view = view
        self.started = time.time()
        self._gpus: dict[str, str | None] = {}
        self._seen: dict[str, tuple[int, str]] = {}  # worker id -> (restarts, generation)
        self._died: dict[str, float] = {}  # "id#generation" -> when first seen dead
        self.finished = FinishedRoles()
        self.resources = ResourceSampler(None if view is None else view.usage)

    def _gpus_of(self, worker: Any) -> str | None:
        key = f"{worker.id}#{worker.generation}"
        if key not in self._gpus:
            v = self.view
            try:
                raw = v.name_resolve.get(
                    name_resolve_keys.worker_info_key(
                        v.experiment, v.trial, worker.role, worker.index
                    )
                )
                self._gpus[key] = json.loads(raw).get("gpus") if raw else None
            except Exception:
                return None
        return self._gpus[key]

    def build(self, calls: CallFigures | dict[str, dict], closed: bool = False) -> dict:
        """``calls``: a ``CallFigures`` sample (or its per-role dict alone)."""
        if not isinstance(calls, CallFigures):
            calls = CallFigures(roles=calls)
        v = self.view
        roles_out, workers_out = [], []
        dead_by_role: dict[str, dict] = {}
        for role, state in list(v.roles.items()):
            owner = state.target if state.kind != "launched" else role
            if owner not in dead_by_role:
                try:
                    dead_by_role[owner] = v.poll(owner) if owner in v.roles else {}
                except Exception:
                    dead_by_role[owner] = {}
            roles_out.append(
                {
                    "role": role,
                    "kind": state.kind,
                    "target": state.target,
                    "replicas": state.job.replicas,
                    "calls": calls.roles.get(role) or _no_calls(),
                    "methods": calls.methods.get(role, {}),
                }
            )
            if state.kind == "reused":
                continue
            own = _poll(v, role) if state.kind == "forked" else {}  # Ray: forks are actors
            workers_out.extend(self._worker_rows(role, state, dead_by_role[owner], own))
        now = time.time()
        for row in workers_out:
            row["calls"] = calls.workers.get(row["id"]) or _no_calls(history=False)
            self._time_of_death(row, now)
        self.resources.sample(workers_out)
        roles_out, workers_out = self.finished.merge(
            roles_out, workers_out, now, calls.roles, calls.workers
        )
        return {
            "version": SNAPSHOT_VERSION,
            "experiment": v.experiment,
            "trial": v.trial,
            "backend": v.backend,
            "time": now,
            "closed": closed,
            "controller": {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "started": self.started,
            },
            "log_dir": v.log_dir,
            "resources_note": self.resources.note,
            "roles": roles_out,
            "workers": workers_out,
        }

    def _worker_rows(self, role: str, state: RoleState, dead: dict, own: dict) -> list[dict]:
        """``dead``: deaths the backend reports for the role's own launched workers, or for
        a forked role, for its host workers; ``own``: a forked role's deaths the backend
        reports itself (where forks are backend processes: Ray actors)."""
        v = self.view
        rows = []
        by_index = {w.index: w for w in list(state.workers)}
        alone = self._deaths_of_forked(role) if state.kind == "forked" else {}
        pending = None
        for index in range(state.job.replicas):
            worker = by_index.get(index)
            row: dict[str, Any] = {
                "id": f"{role}/{index}",
                "role": role,
                "index": index,
                "backend": v.backend,
                "forked_from": f"{state.target}/{index}" if state.kind == "forked" else None,
                "restarts": state.restarts.get(index, 0),
                "log_path": replica_log_path(v.log_dir, role, index),
                "state": "running",
                "exit_code": None,
                "reason": None,
                "log_tail": None,
            }
            if worker is None:
                if pending is None:
                    pending = _pending_reason(v, role)
                row.update(state="starting", reason=pending)
            else:
                row.update(
                    host=worker.host,
                    address=worker.address,
                    gpus=self._gpus_of(worker),
                    pid=worker.pid,
                    backend_id=worker.backend_id,
                    generation=worker.generation,
                    started=started_at(worker.generation),
                    state=self._restart_state(row["id"], row["restarts"], worker.generation),
                )
            exit_ = dead.get(index)
            death = alone.get(index)
            if death is not None and (worker is None or death.get("pid") != worker.pid):
                death = None  # an earlier child at this index
            if exit_ is not None and state.kind == "forked":
                row.update(
                    state="failed",
                    reason=f"its host worker {state.target}/{index} died: {exit_.reason}",
                    log_tail=tail(row["log_path"], LOG_TAIL_LINES),
                )
            elif exit_ is not None or own.get(index) is not None:
                exit_ = exit_ if exit_ is not None else own[index]
                row.update(
                    state="exited" if exit_.exit_code == 0 else "failed",
                    exit_code=exit_.exit_code,
                    reason=exit_.reason,
                    log_tail=tail(exit_.log_path or row["log_path"], LOG_TAIL_LINES),
                )
            elif death is not None:  # the forked child died, its host lives
                code = death.get("exit_code")
                row.update(
                    state="exited" if code == 0 else "failed",
                    exit_code=code,
                    reason=death.get("reason"),
                    log_tail=tail(row["log_path"], LOG_TAIL_LINES),
                )
            rows.append(row)
        return rows

    def _time_of_death(self, row: dict, now: float) -> None:
        """``died_at`` of a failed or exited row: the health monitor's time where it
        recorded the death, else when a snapshot first saw it."""
        if row["state"] not in ("failed", "exited"):
            return
        key = f"{row['id']}#{row.get('generation')}"
        if key not in self._died:
            health = self.view.deaths.get(row["id"]) if self.view is not None else None
            self._died[key] = getattr(health, "time", None) or now
        row["died_at"] = self._died[key]

    def _deaths_of_forked(self, role: str) -> dict[int, dict]:
        """index -> the death record the host worker wrote for a forked child that died
        alone (worker/fork.py); one name-resolve listing per forked role."""
        v = self.view
        found: dict[int, dict] = {}
        try:
            records = v.name_resolve.get_subtree(
                name_resolve_keys.health_prefix(v.experiment, v.trial, role)
            )
        except Exception:  # a record not signed by this trial is not shown
            return found
        for key, value in records.items():
            index = key.rsplit("/", 1)[-1]
            try:
                record = json.loads(value)
            except ValueError:
                continue
            if index.isdigit() and isinstance(record, dict) and "pid" in record:
                found[int(index)] = record
        return found

    def _restart_state(self, worker_id: str, restarts: int, generation: str) -> str:
        """ "restarting" while the controller counts a restart but still holds the old
        process's record (the new one has not registered yet), else "running"."""
        before = self._seen.get(worker_id)
        if before is not None and restarts > before[0] and generation == before[1]:
            return "restarting"
        self._seen[worker_id] = (restarts, generation)
        return "running"


def _poll(v: ControllerView, role: str) -> dict:
    try:
        return v.poll(role)
    except Exception:
        return {}


def _pending_reason(v: ControllerView, role: str) -> str | None:
    try:
        return v.pending_reason(role)
    except Exception:
        return None


def _no_calls(history: bool = True) -> dict:
    if not history:
        return {k: v for k, v in _no_calls().items() if k != "history"}
    return {
        "total": 0,
        "errors": 0,
        "in_flight": 0,
        "rate": 0.0,
        "p50_ms": None,
        "p99_ms": None,
        "history": [],
    }
