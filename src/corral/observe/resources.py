"""CPU, memory and GPU use per worker, for the live view (read on the publisher's
thread, never in the call path).

- CPU% and RSS: of each worker's process tree (the worker and every process under it).
  Each worker measures its own tree with psutil and publishes it every few seconds in a
  signed record (``corral.worker.usage``), so the figures exist on every backend: local,
  Ray and Slurm, wherever the worker runs. The controller reads the trial's usage records
  at most every ``USAGE_READ_EVERY`` seconds (one listing of the store), keeps only those
  signed with the trial's secret (``records.py``) and whose generation is the row's (a
  restarted worker never shows its predecessor's figures).
- GPU utilisation and memory: per worker, over the GPU indices it was given, read with
  NVML (``pynvml``, from the ``nvidia-ml-py`` package) or else ``nvidia-smi``, at most
  every ``GPU_EVERY`` seconds; absent when neither is present. This path has no test
  here (the test machine has no GPU).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable

from corral import name_resolve_keys
from corral.auth import TrialKeys
from corral.discovery import NameResolve
from corral.observe.records import verified_subtree

GPU_EVERY = 5.0  # seconds between GPU readings (nvidia-smi is a process start)
USAGE_READ_EVERY = 2.0  # seconds between readings of the usage records (workers write
# theirs every 5 s: corral.worker.usage.USAGE_EVERY)
USAGE_FIELDS = ("cpu_percent", "rss_bytes", "processes")


def usage_figures(record: object, generation: str) -> dict:
    """The CPU/memory figures of a usage record, if it is the worker ``generation``'s and
    well formed; else nothing."""
    if not isinstance(record, dict) or not generation or record.get("generation") != generation:
        return {}
    out = {}
    for name in USAGE_FIELDS:
        value = record.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
            out[name] = value
    return out


def usage_reader(
    store: NameResolve, secret: str, experiment: str, trial: str
) -> Callable[[], dict[str, dict]]:
    """A function returning worker id -> its usage record, for every record under the
    trial signed with ``secret`` (``store``: the raw store, not the signed wrapper)."""
    trial_keys = TrialKeys(secret)
    prefix = name_resolve_keys.usage_prefix(experiment, trial)

    def read() -> dict[str, dict]:
        good, _refused = verified_subtree(store, trial_keys, prefix)
        out = {}
        for key, value in good.items():
            role, index = key.split("/")[-2:]
            try:
                out[f"{role}/{index}"] = json.loads(value)
            except ValueError:
                continue
        return out

    return read


class ResourceSampler:
    """One per stats publisher: adds the usage records' figures (and GPU readings) to the
    worker rows of each snapshot."""

    def __init__(self, read_usage: Callable[[], dict[str, dict]] | None = None) -> None:
        self.note = None  # a worker without psutil says so in its own log
        self._read_usage = read_usage
        self._usage: dict[str, dict] = {}
        self._usage_at = -USAGE_READ_EVERY
        self._gpu_reader = gpu_reader()
        self._gpu: dict[str, dict] = {}
        self._gpu_at = 0.0

    def sample(self, rows: list[dict]) -> None:
        """Add ``cpu_percent``, ``rss_bytes``, ``processes`` (and ``gpu_util``,
        ``gpu_mem_bytes``) to the running worker rows it has figures for, in place."""
        live = [r for r in rows if r.get("state") in ("running", "restarting")]
        if self._read_usage is not None and live:
            now = time.monotonic()
            if now - self._usage_at >= USAGE_READ_EVERY:
                self._usage_at = now
                try:
                    self._usage = self._read_usage()
                except Exception:  # the store is down for a moment: no figures this time
                    self._usage = {}
            for row in live:
                row.update(usage_figures(self._usage.get(row["id"]), row.get("generation", "")))
        if self._gpu_reader is not None:
            self._gpus(rows)

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
