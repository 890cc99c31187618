"""Where the dashboard and ``corral top`` find trials: the stats files controllers
write under ``<fileroot>/secrets/<experiment>/<trial>/stats.json``."""

from __future__ import annotations

import glob
import json
import os
import time

from corral.discovery import NameResolve
from corral.paths import stats_file
from corral.spec import validate_role_name

STALE_SECONDS = 5.0  # a live controller rewrites its file every second
DEFAULT_MAX_AGE = 3600.0  # trials whose file is older than this are not listed


def stats_path(fileroot: str, experiment: str, trial: str) -> str:
    """The stats file of a trial; names are checked first (ConfigError), so a request
    cannot point outside the fileroot."""
    if experiment != "*":
        validate_role_name(experiment, "experiment")
    if trial != "*":
        validate_role_name(trial, "trial")
    return stats_file(fileroot, experiment, trial)


def read_snapshot(path: str) -> dict | None:
    try:
        with open(path, "rb") as fh:
            snap = json.loads(fh.read())
    except (OSError, ValueError):
        return None
    return snap if isinstance(snap, dict) and "workers" in snap else None


class TrialSource:
    """Every trial under one fileroot (or just one, when ``experiment``/``trial`` are set)."""

    def __init__(
        self,
        fileroot: str,
        experiment: str | None = None,
        trial: str | None = None,
        max_age: float = DEFAULT_MAX_AGE,
        name_resolve: NameResolve | None = None,
    ):
        """``name_resolve``: also list trials whose controller holds a lease there but
        writes no stats file (status "registered", from ``registered.py``)."""
        self.name_resolve = name_resolve
        for field_name, value in (("experiment", experiment), ("trial", trial)):
            if value is not None:
                validate_role_name(value, field_name)
        self.fileroot = os.path.abspath(fileroot)
        self.experiment = experiment
        self.trial = trial
        self.max_age = max_age

    def paths(self) -> list[str]:
        if self.experiment and self.trial:
            return [stats_path(self.fileroot, self.experiment, self.trial)]
        pattern = stats_path(self.fileroot, self.experiment or "*", self.trial or "*")
        return sorted(glob.glob(pattern))

    def trials(self) -> list[dict]:
        """Snapshots, newest first, each with ``status``: live | ended | unresponsive."""
        now = time.time()
        found = []
        explicit = bool(self.experiment and self.trial)
        for path in self.paths():
            try:
                mtime = os.path.getmtime(path)
            except OSError:
                continue
            if not explicit and now - mtime > self.max_age:
                continue
            snap = read_snapshot(path)
            if snap is None:
                continue
            age = now - float(snap.get("time", mtime))
            snap["status"] = (
                "ended"
                if snap.get("closed")
                else "live"
                if age <= STALE_SECONDS
                else "unresponsive"
            )
            snap["age"] = round(age, 1)
            found.append(snap)
        seen = {(s["experiment"], s["trial"]) for s in found}
        for key, snap in self._registered().items():
            wanted = (self.experiment in (None, key[0])) and (self.trial in (None, key[1]))
            if key not in seen and wanted:
                found.append(snap)
        found.sort(key=lambda s: -float(s["controller"].get("started") or 0))
        return found

    def _registered(self) -> dict[tuple[str, str], dict]:
        if self.name_resolve is None:
            return {}
        from corral.observe.registered import registered_trials

        try:
            return registered_trials(self.name_resolve, self.fileroot)
        except Exception:  # an unreachable etcd must not take the page down
            return {}

    def find(self, experiment: str, trial: str) -> dict | None:
        snap = read_snapshot(stats_path(self.fileroot, experiment, trial))
        return snap if snap is not None else self._registered().get((experiment, trial))

    def log_path(self, experiment: str, trial: str, worker_id: str) -> str | None:
        """The log file of one worker, as its controller published it (never a path
        built from the request: only paths listed in a snapshot are served)."""
        snap = self.find(experiment, trial)
        if snap is None:
            return None
        for worker in snap["workers"]:
            if worker["id"] == worker_id:
                return worker.get("log_path")
        return None
