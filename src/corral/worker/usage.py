"""The worker's own CPU and memory figures, for ``corral top``, the dashboard and
Prometheus on every backend.

A thread of the worker measures its process tree (the worker and every process under
it: engine subprocesses, forked workers) with psutil every ``USAGE_EVERY`` seconds and
writes ``{"generation", "pid", "cpu_percent", "rss_bytes", "processes", "t"}`` to the
signed record ``<experiment>/<trial>/_usage/<role>/<index>``. The controller reads them
(``corral.observe.resources``), wherever the worker runs: a Slurm node, a Ray node, this
host. A measurement costs about 3 ms of CPU (psutil reads every process's parent to find
the tree's children) plus one store write; nothing in the call path.

psutil is imported on the thread, ``QUIET_START`` seconds after the worker registered:
a worker's start does not load it, and neither does the start of the workers started
beside it (importing psutil costs about as much CPU as a worker's whole start; 8 or 32
workers started at once on a few cores would each pay it while the others still start).
``CORRAL_STATS=0`` in the worker's environment turns the report off.
"""

from __future__ import annotations

import os
import threading
import time

from corral import cjson, name_resolve_keys

USAGE_EVERY = 5.0  # seconds between reports
FIRST_WINDOW = 1.0  # the first CPU% is over this long (it needs two readings)
QUIET_START = 2.0  # seconds after registering before psutil is imported (see above)

TYPE_CHECKING = False  # typing's, without importing typing (a worker's start)
if TYPE_CHECKING:
    from typing import Any


class TreeMeter:
    """CPU% (since the previous reading) and RSS of one process and all under it; keeps
    psutil's Process objects between readings (CPU% is per object)."""

    def __init__(self, pid: int):
        import psutil

        self.psutil = psutil
        self.root = psutil.Process(pid)
        self._procs: dict[int, Any] = {}

    def read(self) -> dict:
        psutil = self.psutil
        try:
            tree = [self.root, *self.root.children(recursive=True)]
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            tree = [self.root]
        cpu, rss, alive, seen = 0.0, 0, 0, set()
        for found in tree:
            proc = self._procs.setdefault(found.pid, found)
            seen.add(found.pid)
            try:
                with proc.oneshot():
                    cpu += proc.cpu_percent(None)
                    rss += proc.memory_info().rss
                alive += 1
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                self._procs.pop(found.pid, None)
        for pid in set(self._procs) - seen:
            del self._procs[pid]
        return {"cpu_percent": round(cpu, 1), "rss_bytes": rss, "processes": alive}


def report_usage(runtime: Any) -> None:
    """The thread's body: measure and publish until the worker stops."""
    if os.environ.get("CORRAL_STATS") == "0":
        return
    s = runtime.settings
    key = name_resolve_keys.worker_usage_key(s.experiment, s.trial, s.role, s.index)
    if runtime.stopped.wait(QUIET_START):
        return
    try:
        meter = TreeMeter(os.getpid())
        meter.read()  # the start of the first CPU% window
    except Exception as exc:  # psutil missing or broken: the view shows no figures
        print(f"corral worker {s.worker_id}: no CPU/memory figures ({exc})", flush=True)
        return
    wait = FIRST_WINDOW
    while not runtime.stopped.wait(wait):
        wait = USAGE_EVERY
        figures = meter.read()
        record = {"generation": runtime.generation, "pid": os.getpid(), "t": time.time()}
        try:
            if not runtime.stopped.is_set():
                runtime.name_resolve.add(key, cjson.dumps({**record, **figures}), replace=True)
        except Exception:  # the store is down for a moment: the next report will do
            pass


def start_report(runtime: Any) -> None:
    """Start the reporting thread of a registered worker."""
    threading.Thread(target=report_usage, args=(runtime,), name="corral-usage", daemon=True).start()
