"""CPU, memory and GPU use per worker, for the live view (sampled on the publisher's
thread, never in the call path).

- CPU% and RSS: of each worker's process tree (the worker and every process under it),
  with psutil, for workers whose processes this controller can see (the local backend:
  they are its children's trees on this host). psutil is a core dependency; where it
  cannot be imported the figures are absent and ``note`` says why.
- GPU utilisation and memory: per worker, over the GPU indices it was given, read with
  NVML (``pynvml``, from the ``nvidia-ml-py`` package) or else ``nvidia-smi``, at most
  every ``GPU_EVERY`` seconds; absent when neither is present. This path has no test
  here (the test machine has no GPU).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from typing import Any

GPU_EVERY = 5.0  # seconds between GPU readings (nvidia-smi is a process start)
CPU_EVERY = 5.0  # seconds between CPU/memory readings: one costs ~20 ms of CPU with
# ~200 processes on the host (psutil lists them all to find each worker's children)
SAMPLED_BACKENDS = ("local",)  # workers whose pids are this host's


class ResourceSampler:
    """One per stats publisher; keeps psutil's Process objects between samples (CPU% is
    the use since the previous sample of the same process)."""

    def __init__(self) -> None:
        try:
            import psutil
        except ImportError:  # psutil is a core dependency; a broken install still runs
            psutil = None
        self.psutil = psutil
        self.note = None if psutil else "psutil is not installed: no CPU/memory per worker"
        self._procs: dict[int, Any] = {}
        self._gpu_reader = gpu_reader()
        self._gpu: dict[str, dict] = {}
        self._gpu_at = 0.0
        self._cpu_at = -CPU_EVERY
        self._cpu: dict[str, dict] = {}  # worker id -> its last CPU/memory figures

    def sample(self, rows: list[dict]) -> None:
        """Add ``cpu_percent``, ``rss_bytes`` (and ``gpu_util``, ``gpu_mem_bytes``) to
        the worker rows it can measure, in place."""
        mine = [
            r for r in rows if r.get("pid") and r.get("backend") in SAMPLED_BACKENDS and
            r.get("state") in ("running", "restarting")
        ]  # fmt: skip
        if self.psutil is not None and mine:
            now = time.monotonic()
            if now - self._cpu_at >= CPU_EVERY:
                self._cpu_at = now
                self._cpu = self._cpu_and_memory(mine)
            for row in mine:
                row.update(self._cpu.get(row["id"], {}))
        if self._gpu_reader is not None:
            self._gpus(rows)

    def _cpu_and_memory(self, rows: list[dict]) -> dict[str, dict]:
        """worker id -> CPU% (since the last reading), RSS and process count of its tree;
        each process is read once, however many rows share it."""
        psutil = self.psutil
        children: dict[int, list[int]] = {}
        for proc in psutil.process_iter(["ppid"]):
            children.setdefault(proc.info["ppid"], []).append(proc.pid)
        figures: dict[int, tuple[float, int] | None] = {}
        out: dict[str, dict] = {}
        for row in rows:
            tree, todo = [], [int(row["pid"])]
            while todo:
                pid = todo.pop()
                tree.append(pid)
                todo.extend(children.get(pid, ()))
            cpu, rss, alive = 0.0, 0, 0
            for pid in tree:
                if pid not in figures:
                    figures[pid] = self._read(pid)
                if figures[pid] is not None:
                    cpu, rss, alive = cpu + figures[pid][0], rss + figures[pid][1], alive + 1
            if alive:
                out[row["id"]] = {
                    "cpu_percent": round(cpu, 1),
                    "rss_bytes": rss,
                    "processes": alive,
                }
        for pid in set(self._procs) - set(figures):
            del self._procs[pid]
        return out

    def _read(self, pid: int) -> tuple[float, int] | None:
        psutil = self.psutil
        proc = self._procs.get(pid)
        try:
            if proc is None:
                proc = self._procs[pid] = psutil.Process(pid)
            with proc.oneshot():
                return proc.cpu_percent(None), proc.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            self._procs.pop(pid, None)
            return None

    def _gpus(self, rows: list[dict]) -> None:
        now = time.monotonic()
        if now - self._gpu_at >= GPU_EVERY:
            self._gpu_at = now
            try:
                self._gpu = self._gpu_reader()
            except Exception:
                self._gpu = {}
        if not self._gpu:
            return
        for row in rows:
            indices = [i.strip() for i in str(row.get("gpus") or "").split(",") if i.strip()]
            found = [self._gpu[i] for i in indices if i in self._gpu]
            if found:
                row["gpu_util"] = round(sum(g["util"] for g in found) / len(found), 1)
                row["gpu_mem_bytes"] = sum(g["mem"] for g in found)


def gpu_reader():
    """A function returning ``{index: {"util": %, "mem": bytes}}`` for every GPU of this
    host, or None where there is neither NVML nor nvidia-smi."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        pynvml = None
    if pynvml is not None:

        def read_nvml() -> dict[str, dict]:
            out = {}
            for i in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                util = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
                out[str(i)] = {"util": util, "mem": pynvml.nvmlDeviceGetMemoryInfo(handle).used}
            return out

        return read_nvml
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None

    def read_smi() -> dict[str, dict]:
        text = subprocess.run(
            [smi, "--query-gpu=index,utilization.gpu,memory.used", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=3, check=True,
        ).stdout  # fmt: skip
        out = {}
        for line in text.splitlines():
            parts = [p.strip() for p in line.split(",")]
            if len(parts) == 3 and parts[0].isdigit():
                out[parts[0]] = {"util": float(parts[1]), "mem": int(float(parts[2]) * 2**20)}
        return out

    return read_smi
