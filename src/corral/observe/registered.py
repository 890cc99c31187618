"""Trials that run without a stats file (a controller with ``CORRAL_STATS=0``, or one
from before the live view): what name-resolve says about them — the controller's lease
and each registered worker's address, pid, host, generation and CPU/memory (its usage
record) — only from records signed with the trial's secret (``records.py``). No call
figures and no exit codes: those only the controller knows."""

from __future__ import annotations

import json
import os
import time

from corral.discovery import NameResolve
from corral.logs import log_dir_for, replica_log_path
from corral.observe.records import refused_note, trial_keys, verified
from corral.observe.resources import usage_figures
from corral.observe.snapshot import SNAPSHOT_VERSION, started_at


def _json(value: str | None) -> dict:
    try:
        loaded = json.loads(value) if value else {}
    except ValueError:
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _by_trial(records: dict[str, str]) -> dict[tuple[str, str], dict[str, str]]:
    found: dict[tuple[str, str], dict[str, str]] = {}
    for key, stored in records.items():
        parts = key.split("/")
        if len(parts) >= 3:
            found.setdefault((parts[0], parts[1]), {})[key] = stored
    return found


def registered_trials(nr: NameResolve, fileroot: str) -> dict[tuple[str, str], dict]:
    """(experiment, trial) -> a snapshot with ``status`` "registered", for every trial
    whose controller holds a lease in ``nr`` signed with the trial's secret (the secret
    file under ``fileroot``). Records not signed with it are never shown: a trial whose
    lease is not is left out, and a verified trial's refused records are named in its
    ``records_note``."""
    out = {}
    for (experiment, trial), records in _by_trial(nr.get_all()).items():
        good, refused = verified(trial_keys(fileroot, experiment, trial), records)
        lease_key = f"{experiment}/{trial}/_controller"
        if lease_key not in good:
            continue  # no secret here to check it with, or forged: nothing of it is shown
        snap = _snapshot(experiment, trial, _json(good[lease_key]), _workers(good), fileroot)
        snap["records_note"] = refused_note(refused)
        out[(experiment, trial)] = snap
    return out


def _workers(good: dict[str, str]) -> dict[str, dict]:
    """role/index -> address, info and usage, from verified records only."""
    workers: dict[str, dict] = {}
    for key, value in good.items():
        parts = key.split("/")
        if len(parts) == 4 and not parts[2].startswith("_"):
            workers.setdefault(f"{parts[2]}/{parts[3]}", {})["address"] = value
        elif len(parts) == 5 and parts[2] == "_info":
            workers.setdefault(f"{parts[3]}/{parts[4]}", {}).update(_json(value))
        elif len(parts) == 5 and parts[2] == "_usage":
            workers.setdefault(f"{parts[3]}/{parts[4]}", {})["usage"] = _json(value)
    return workers


def _snapshot(
    experiment: str, trial: str, lease: dict, workers: dict[str, dict], fileroot: str
) -> dict:
    log_dir = log_dir_for(fileroot, experiment, trial)
    rows = []
    for wid, info in sorted(workers.items()):
        role, _, index = wid.partition("/")
        if "address" not in info or not index.isdigit():
            continue
        row = {
            "id": wid,
            "role": role,
            "index": int(index),
            "backend": "",
            "forked_from": None,
            "restarts": 0,
            "log_path": replica_log_path(log_dir, role, int(index)),
            "state": "registered",
            "exit_code": None,
            "reason": None,
            "log_tail": None,
            "host": info.get("host", ""),
            "address": info["address"],
            "gpus": info.get("gpus"),
            "pid": info.get("pid"),
            "backend_id": info.get("backend_id"),
            "generation": info.get("generation", ""),
            "started": started_at(info.get("generation", "")),
        }
        row.update(usage_figures(info.get("usage"), row["generation"]))
        rows.append(row)
    roles: dict[str, int] = {}
    for row in rows:
        roles[row["role"]] = roles.get(row["role"], 0) + 1
    return {
        "version": SNAPSHOT_VERSION,
        "experiment": experiment,
        "trial": trial,
        "backend": "",
        "time": time.time(),
        "closed": False,
        "status": "registered",
        "age": 0.0,
        "controller": {"pid": lease.get("pid"), "host": lease.get("host"), "started": None},
        "log_dir": log_dir if os.path.isdir(log_dir) else None,
        "roles": [
            {
                "role": role,
                "kind": "registered",
                "target": None,
                "replicas": n,
                "calls": {
                    "total": 0,
                    "errors": 0,
                    "in_flight": 0,
                    "rate": 0.0,
                    "p50_ms": None,
                    "p99_ms": None,
                    "history": [],
                },
            }  # fmt: skip
            for role, n in roles.items()
        ],
        "workers": rows,
    }
