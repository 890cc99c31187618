"""Shared pieces of the benchmark harness: rows, targets, statistics, machine facts, cleanup.

Every figure is reported next to a baseline measured in the same run, because the machines
this runs on are small and noisy: only the ratio between the two is meant to be compared
across runs. ``ratio`` is always "how many times corral's cost exceeds the baseline's":
time / baseline time for durations, baseline rate / rate for throughputs. 1.0 means as fast
as the baseline, 2.0 means half as fast.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

PEER_SOURCE = "AReaL 1.0.4 LocalScheduler (recipes/README.md, 'Peer figures'; order of magnitude)"


class BackendUnavailable(RuntimeError):
    """A backend's benchmark cannot run here (its corral module or runtime is missing)."""


@dataclass
class Target:
    """One goal for a row: ``kind`` "abs" compares ``value``, "ratio" compares ``ratio``."""

    kind: str  # "abs" | "ratio"
    op: str  # "<=" | ">=" | "=="
    threshold: float
    text: str
    met: bool | None = None

    def check(self, value: float | None, ratio: float | None) -> bool | None:
        subject = value if self.kind == "abs" else ratio
        if subject is None or (isinstance(subject, float) and math.isnan(subject)):
            return None
        if self.op == "<=":
            return subject <= self.threshold
        if self.op == ">=":
            return subject >= self.threshold
        if self.op == "==":
            return subject == self.threshold
        raise ValueError(f"unknown comparison {self.op!r}")


@dataclass
class Row:
    """One measured figure of a backend, its same-run baseline and its targets."""

    key: str
    backend: str
    label: str
    unit: str
    value: float | None
    baseline: float | None = None
    baseline_label: str = ""
    higher_is_better: bool = False
    targets: list[Target] = field(default_factory=list)
    samples: dict[str, list[float]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    ratio: float | None = None
    met: bool | None = None

    def finish(self) -> Row:
        self.ratio = slowdown(self.value, self.baseline, self.higher_is_better)
        results = [t.check(self.value, self.ratio) for t in self.targets]
        for target, result in zip(self.targets, results, strict=True):
            target.met = result
        if not self.targets or any(r is None for r in results):
            self.met = None
        else:
            self.met = all(results)
        return self

    def to_json(self) -> dict:
        return asdict(self)


def slowdown(value: float | None, baseline: float | None, higher_is_better: bool) -> float | None:
    """How many times corral's cost exceeds the baseline's (see the module docstring)."""
    if value is None or baseline is None:
        return None
    if higher_is_better:
        return baseline / value if value > 0 else math.inf
    return value / baseline if baseline > 0 else None


def percentile(values: Iterable[float], q: float) -> float:
    """Linear-interpolated percentile (``q`` in 0..100) of a non-empty sequence."""
    data = sorted(values)
    if not data:
        raise ValueError("percentile of no values")
    pos = (len(data) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def median(values: Iterable[float]) -> float:
    return percentile(values, 50.0)


def rounded(values: Iterable[float], digits: int = 6) -> list[float]:
    return [round(v, digits) for v in values]


def log(text: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def _version(dist: str) -> str | None:
    """An installed distribution's version, without importing it (torch is slow to import)."""
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _git_commit(repo: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def machine_info(repo: str) -> dict[str, Any]:
    """Facts that explain the figures: CPUs, load, versions, date."""
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = None
    try:
        load = list(os.getloadavg())
    except OSError:
        load = None
    mem_total = None
    with contextlib.suppress(OSError):
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    mem_total = int(line.split()[1]) * 1024
                    break
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": affinity,
        "loadavg_at_start": load,
        "mem_total_bytes": mem_total,
        "python": sys.version.split()[0],
        "python_executable": sys.executable,
        "numpy": _version("numpy"),
        "torch": _version("torch"),
        "corral": _version("corral"),
        "git_commit": _git_commit(repo),
        "baseline_python": python_provenance(),
    }


def python_provenance() -> dict[str, Any]:
    """How the baselines' ``python -c pass`` (and every worker) was made: the interpreter,
    the venv, where packages come from, and whether corral's bytecode was cached."""
    import site

    prefix = sys.prefix if sys.prefix != sys.base_prefix else None
    try:
        packages = site.getsitepackages()
    except AttributeError:
        packages = []
    return {
        "interpreter": sys.executable,
        "version": sys.version.split()[0],
        "venv": prefix,
        "site_packages": packages,
        "PYTHONDONTWRITEBYTECODE": os.environ.get("PYTHONDONTWRITEBYTECODE") or None,
        "corral_bytecode": _corral_bytecode(),
    }


def _corral_bytecode() -> str:
    """Whether corral's modules have their bytecode cached (PYTHONDONTWRITEBYTECODE=1 in
    an environment without it makes every worker compile corral at each start)."""
    folder = _corral_folder()
    if folder is None:
        return "corral not found"
    state = "present" if _has_bytecode(folder) else "missing: each worker compiles corral"
    return f"{state} ({folder})"


def ensure_corral_bytecode() -> None:
    """Compile corral's modules whose bytecode is missing or older than their source, as
    installing a package does (an editable checkout under PYTHONDONTWRITEBYTECODE=1 never
    gets it, and a module edited since would be compiled again by every worker: 5 ms for
    worker/runtime.py). Up-to-date files are only checked."""
    import compileall

    folder = _corral_folder()
    if folder is not None:
        compileall.compile_dir(folder, quiet=1)


def _corral_folder() -> str | None:
    import importlib.util

    spec = importlib.util.find_spec("corral")
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def _has_bytecode(folder: str) -> bool:
    import importlib.util

    return os.path.exists(
        importlib.util.cache_from_source(os.path.join(folder, "worker", "runtime.py"))
    )


class Context:
    """What one benchmark run shares: options, a fresh fileroot, rows so far, cleanup."""

    def __init__(self, quick: bool, repo: str):
        self.quick = quick
        self.repo = repo
        self.run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        self.fileroot = tempfile.mkdtemp(prefix="corral-bench-", dir="/tmp")
        self.rows: list[Row] = []
        self._cleanups = contextlib.ExitStack()
        self._names = 0

    def unique_name(self, prefix: str) -> str:
        """A name valid as a corral experiment or role, unique within this run."""
        self._names += 1
        return f"{prefix}-{self.run_id}-{self._names}"

    def row(self, key: str) -> Row | None:
        """A row measured earlier in this run (another backend may use it as a baseline)."""
        return next((r for r in self.rows if r.key == key), None)

    def on_close(self, fn: Callable[..., Any], *args: Any) -> None:
        self._cleanups.callback(fn, *args)

    def close(self) -> None:
        try:
            self._cleanups.close()
        finally:
            shutil.rmtree(self.fileroot, ignore_errors=True)


# ----------------------------------------------------------------- processes left
def _proc_stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, ppid, pgrp, session) of a live pid, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            raw = fh.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = raw[raw.rfind(")") + 2 :].split()
    return fields[0], int(fields[1]), int(fields[2]), int(fields[3])


def processes_left(pids: Iterable[int]) -> dict[str, Any]:
    """Which of ``pids`` (worker processes) or anything in their sessions still exists.

    Workers are started in their own session, so a forked child or a stray helper shows up
    under the worker's session id even after the worker itself is gone. A zombie counts as
    left when this process is its parent (it should have reaped it); a zombie of another
    parent (Ray's raylet) holds nothing and is its parent's to reap, so it is only listed.
    """
    pids = [int(p) for p in pids if p]
    me = os.getpid()
    alive, zombies, foreign_zombies = [], [], []
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        except PermissionError:
            pass
        stat = _proc_stat(pid)
        if stat is None:
            continue
        if stat[0] != "Z":
            alive.append(pid)
        elif stat[1] == me:
            zombies.append(pid)
        else:
            foreign_zombies.append({"pid": pid, "parent": stat[1]})
    sessions = set(pids)
    in_sessions = []
    if sessions and os.path.isdir("/proc"):
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) in pids:
                continue
            stat = _proc_stat(int(entry))
            if stat is not None and (stat[2] in sessions or stat[3] in sessions):
                in_sessions.append(int(entry))
    return {
        "checked": len(pids),
        "alive": alive,
        "zombies": zombies,
        "zombies_of_other_parents": foreign_zombies,
        "in_worker_sessions": in_sessions,
        "left": len(alive) + len(zombies) + len(in_sessions),
    }


_HELD_LOCKS: set[str] = set()


def hold_lock(ctx: Context, path: str, what: str) -> None:
    """Take the shared service's lock file (others' tests use it too) until the run ends;
    once per run: a second flock on a new descriptor of this process would wait for the
    first forever (bench_slurm and bench_shapes both use the Slurm cluster)."""
    import fcntl

    if path in _HELD_LOCKS:
        return
    fh = open(path, "a")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        log(f"{what}: waiting for {path} (another user of the {what} service)")
        fcntl.flock(fh, fcntl.LOCK_EX)
    _HELD_LOCKS.add(path)

    def release() -> None:
        _HELD_LOCKS.discard(path)
        fh.close()

    ctx.on_close(release)


# ----------------------------------------------------------------- shared measurements
def time_forks(sched: Any, reps: int, cpu: int = 0) -> list[float]:
    """Seconds until one worker forked next to a one-worker role is ready (colocation
    with ``fork=True``, the ``POST /fork`` path), ``reps`` times; each is deleted after."""
    from corral import Job, SchedulingSpec, SchedulingStrategy

    host = "forkhost"
    sched.create_workers(Job(role=host, replicas=1, tasks=[SchedulingSpec(cpu=cpu, gpu=0)]))
    times = []
    try:
        for rep in range(reps):
            started = time.perf_counter()
            sched.create_workers(
                Job(
                    role=f"forked{rep}",
                    replicas=1,
                    tasks=[SchedulingSpec(cpu=cpu, gpu=0)],
                    scheduling_strategy=SchedulingStrategy("colocation", target=host, fork=True),
                )
            )
            times.append(time.perf_counter() - started)
            sched.delete_workers(f"forked{rep}")
    finally:
        sched.delete_workers(host)
    return times


def run_alone_on_echo_workers(bench: Callable[..., list[Row]], experiment: str) -> None:
    """Run one overhead benchmark by itself (``python benchmarks/<name>.py [--quick]``):
    4 local workers with an echo engine each, the rows printed."""
    import asyncio

    from corral import Job
    from corral.backends.local import LocalScheduler
    from corral.config import BaseExperimentConfig

    quick = "--quick" in sys.argv
    ctx = Context(quick, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        cfg = BaseExperimentConfig(experiment_name=ctx.unique_name(experiment), trial_name="t0")
        sched = LocalScheduler(
            exp_config=cfg, gpu_devices=[], fileroot=ctx.fileroot, progress=lambda t: None
        )
        ctx.on_close(sched.close)
        ids = sched.create_workers(Job(role="main", replicas=4))
        for wid in ids:
            asyncio.run(sched.create_engine(wid, "corral.testing.engines.EchoEngine"))
        for row in bench(sched, ids, quick):
            row.finish()
            print(
                f"{row.key}: {row.value:.4f} vs {row.baseline:.4f} {row.unit}, ratio {row.ratio:.3f}"
            )
    finally:
        ctx.close()
