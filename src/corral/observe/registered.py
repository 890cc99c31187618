"""Trials that run without a stats file (a controller with ``CORRAL_STATS=0``, or one
from before the live view): what name-resolve says about them — the controller's lease
and each registered worker's address, pid, host and generation. No call figures and no
exit codes: those only the controller knows."""

from __future__ import annotations

import json
import os
import time

from corral.auth import unverified_value
from corral.discovery import NameResolve
from corral.logs import log_dir_for, replica_log_path
from corral.observe.snapshot import SNAPSHOT_VERSION, started_at


def _json(value: str | None) -> dict:
    try:
        loaded = json.loads(value) if value else {}
    except ValueError:
        return {}
    return loaded if isinstance(loaded, dict) else {}


def registered_trials(nr: NameResolve, fileroot: str) -> dict[tuple[str, str], dict]:
    """(experiment, trial) -> a snapshot with ``status`` "registered", for every trial
    whose controller holds a lease in ``nr``."""
    leases: dict[tuple[str, str], dict] = {}
    workers: dict[tuple[str, str], dict[str, dict]] = {}
    for key, raw in nr.get_all().items():
        value = unverified_value(raw)  # display only: nothing here connects to an address
        parts = key.split("/")
        trial = (parts[0], parts[1]) if len(parts) >= 3 else None
        if len(parts) == 3 and parts[2] == "_controller":
            leases[trial] = _json(value)
        elif len(parts) == 4 and not parts[2].startswith("_"):
            workers.setdefault(trial, {}).setdefault(f"{parts[2]}/{parts[3]}", {})["address"] = (
                value
            )
        elif len(parts) == 5 and parts[2] == "_info":
            workers.setdefault(trial, {}).setdefault(f"{parts[3]}/{parts[4]}", {}).update(
                _json(value)
            )
    out = {}
    for (experiment, trial), lease in leases.items():
        log_dir = log_dir_for(fileroot, experiment, trial)
        rows = []
        for wid, info in sorted(workers.get((experiment, trial), {}).items()):
            role, _, index = wid.partition("/")
            if "address" not in info or not index.isdigit():
                continue
            rows.append(
                {
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
            )
        roles: dict[str, int] = {}
        for row in rows:
            roles[row["role"]] = roles.get(row["role"], 0) + 1
        out[(experiment, trial)] = {
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
                        "p50_ms": 0.0,
                        "p99_ms": 0.0,
                        "history": [],
                    },
                }  # fmt: skip
                for role, n in roles.items()
            ],
            "workers": rows,
        }
    return out
