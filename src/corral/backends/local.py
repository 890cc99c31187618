"""LocalScheduler: workers as subprocesses of this machine, GPUs given exclusively."""

from __future__ import annotations

import glob
import os
import shlex
import sys
import threading
from typing import Any

from corral.config import cluster_field
from corral.errors import ConfigError, PlacementError
from corral.launcher import Launcher, LaunchRequest, WorkerExit
from corral.logs import LogPump, replica_log_path
from corral.procs import describe_returncode, spawn, stop_process_groups
from corral.scheduler import Scheduler
from corral.spec import NormalizedJob
from corral.worker import env as E


def detect_gpu_devices() -> list[int]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [int(x) for x in visible.split(",") if x.strip().isdigit()]
    return sorted(int(p.removeprefix("/dev/nvidia")) for p in glob.glob("/dev/nvidia[0-9]*"))


class LocalLauncher(Launcher):
    name = "local"
    fds_per_worker = 5  # output pipe, three log files, a connection

    def __init__(self, gpu_devices: list[int] | None = None):
        devices = detect_gpu_devices() if gpu_devices is None else list(gpu_devices)
        if len(set(devices)) != len(devices) or any(
            not isinstance(d, int) or d < 0 for d in devices
        ):
            raise ConfigError("gpu_devices", gpu_devices, "use a list of distinct GPU indices >= 0")
        self.devices = devices
        self._free = list(devices)
        self._procs: dict[str, list] = {}
        self._gpus: dict[str, list[list[int]]] = {}
        self._specs: dict[str, tuple] = {}
        self._log_dir = ""
        self._pump = LogPump(on_error=lambda text: self.progress(text))
        self._lock = threading.Lock()

    def check(self, job: NormalizedJob) -> None:
        need = job.total_gpus
        if need > len(self._free):
            raise PlacementError(
                f"{job.role}: gpu per worker x replicas",
                need,
                f"only {len(self._free)} of {len(self.devices)} GPUs are free on this machine "
                f"(devices {self.devices}); lower gpu/replicas, delete other roles, or declare "
                "devices with gpu_devices=[...]",
            )

    def launch(self, request: LaunchRequest) -> None:
        job = request.job
        procs = []
        taken: list[list[int]] = []
        self._log_dir = request.log_dir
        try:
            for index, (spec, env) in enumerate(zip(job.tasks, request.envs, strict=True)):
                with self._lock:
                    devices, self._free = self._free[: spec.gpu], self._free[spec.gpu :]
                taken.append(devices)
                procs.append(self._start(job.role, index, spec, env, devices))
        finally:
            self._procs[job.role] = procs
            self._gpus[job.role] = taken
            self._specs[job.role] = job.tasks

    def _start(self, role: str, index: int, spec, env: dict[str, str], devices: list[int]):
        env = dict(env)
        env[E.DIE_WITH_PARENT] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, devices))
        argv = shlex.split(spec.cmd) if spec.cmd else [sys.executable, "-m", "corral.worker"]
        proc = spawn(argv, env)
        self._pump.add(proc.stdout, self._log_dir, role, index)
        return proc

    def restart(self, role: str, index: int, env: dict[str, str]) -> None:
        stop_process_groups([self._procs[role][index]], grace=1.0)
        spec = self._specs[role][index]
        self._procs[role][index] = self._start(role, index, spec, env, self._gpus[role][index])

    def poll(self, role: str) -> dict[int, WorkerExit]:
        dead = {}
        for index, proc in enumerate(self._procs.get(role, [])):
            code = proc.poll()
            if code is not None:
                dead[index] = WorkerExit(
                    describe_returncode(code), code, replica_log_path(self._log_dir, role, index)
                )
        if dead:
            self._pump.flush_closed(0.3)
        return dead

    def stop(self, role: str) -> None:
        procs = self._procs.pop(role, [])
        stop_process_groups(procs)
        self._specs.pop(role, None)
        with self._lock:
            for devices in self._gpus.pop(role, []):
                self._free.extend(devices)
            self._free.sort()

    def pids(self, role: str) -> list[int]:
        return [p.pid for p in self._procs.get(role, [])]

    def close(self) -> None:
        for role in list(self._procs):
            self.stop(role)


class LocalScheduler(Scheduler):
    """Workers are subprocesses of this machine. ``gpu_devices`` declares GPU indices
    (works without physical GPUs); by default they are detected."""

    backend = "local"

    def __init__(
        self, exp_config: Any = None, *, gpu_devices: list[int] | None = None, **kwargs: Any
    ):
        if gpu_devices is None:
            gpu_devices = cluster_field(exp_config, "gpu_devices")
        super().__init__(exp_config, launcher=LocalLauncher(gpu_devices), **kwargs)
