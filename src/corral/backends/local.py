"""LocalScheduler: workers as subprocesses of this machine, GPUs given exclusively."""

from __future__ import annotations

import glob
import logging
import os
import shlex
import socket
import threading
from collections.abc import Callable
from functools import partial
from typing import Any

from corral import identity
from corral import scheduler_keywords as opts
from corral.capabilities import Adoptable, Elastic, ServesCommands
from corral.config import cluster_field
from corral.controller.scheduler import Scheduler
from corral.errors import ConfigError, GPURequestError, SchedulerError
from corral.foreign import ServedAt
from corral.launcher import Launcher, LaunchRequest, WorkerExit, env_lines
from corral.logs import LogPump, replica_log_path
from corral.procs import AdoptedProcess, describe_returncode, spawn, stop_process_groups
from corral.spec import NormalizedJob, SchedulingSpec
from corral.worker import env as E
from corral.worker.args import args_from_env, command_argv, free_ports
from corral.worker.env import advertise_host

GPU_SHARING = ("exclusive", "round_robin")
log = logging.getLogger("corral")


def detect_gpu_devices() -> list[int]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [int(x) for x in visible.split(",") if x.strip().isdigit()]
    return sorted(int(p.removeprefix("/dev/nvidia")) for p in glob.glob("/dev/nvidia[0-9]*"))


def _argv(spec: SchedulingSpec, env: dict[str, str], port: int) -> list[str]:
    """A worker's command: corral's worker reads its environment only; a module of the
    user's (``spec.cmd``) gets AReaL's arguments too, told to serve on ``port``."""
    argv = command_argv(spec.cmd)
    if argv[1:] == ["-m", "corral.worker"]:
        return argv
    return argv + args_from_env(env, port=port)


class GpuLedger:
    """This machine's GPUs: which devices a worker gets, given exclusively (taken from the
    free list, given back when it stops) or, with ``round_robin``, in turn (shared)."""

    def __init__(self, devices: list[int], sharing: str):
        self.devices = devices
        self.sharing = sharing
        self.free = list(devices)
        self.turn = 0
        self.lock = threading.Lock()

    @property
    def exclusive(self) -> bool:
        return self.sharing != "round_robin"

    def refuse_over_free(self, need: int, field: str, fix: str, role: str) -> None:
        """GPURequestError when ``need`` exclusive devices are more than are free."""
        if self.exclusive and need > len(self.free):
            raise GPURequestError(field, need, fix, role)

    def take(self, count: int) -> list[int]:
        """``count`` devices: the first free ones, or (round robin) the next in turn."""
        with self.lock:
            if not self.exclusive:
                picked = [self.devices[(self.turn + i) % len(self.devices)] for i in range(count)]
                self.turn += count
                return picked
            devices, self.free = self.free[:count], self.free[count:]
            return devices

    def preview(self, counts: list[int]) -> list[list[int]]:
        """The devices ``take`` would hand out for ``counts``, taking nothing (dry runs)."""
        free, turn, out = list(self.free), self.turn, []
        for count in counts:
            if not self.exclusive:
                out.append([self.devices[(turn + i) % len(self.devices)] for i in range(count)])
                turn += count
            else:
                out.append(free[:count])
                free = free[count:]
        return out

    def give_back(self, held: list[list[int]]) -> None:
        with self.lock:
            if self.exclusive:
                for devices in held:
                    self.free.extend(devices)
            self.free.sort()


class LocalWorkers:
    """The worker processes of each role, their GPUs and specs, by replica index; where
    worker commands were told to serve; the directory their logs go to."""

    def __init__(self) -> None:
        self.procs: dict[str, list] = {}
        self.gpus: dict[str, list[list[int]]] = {}
        self.specs: dict[str, tuple] = {}
        self.served: dict[tuple[str, int], ServedAt] = {}  # worker commands' --port
        self.log_dir = ""


#: starts replica ``index`` of ``role`` with its spec, environment and devices
StartWorker = Callable[[str, int, SchedulingSpec, dict, list], Any]


class LocalElastic(Elastic):
    """Grow a running role by new processes, shrink it by its highest replicas."""

    def __init__(self, workers: LocalWorkers, gpus: GpuLedger, start: StartWorker):
        self.workers, self.gpus, self.start = workers, gpus, start

    def grow(self, request: LaunchRequest, first: int) -> None:
        role, tasks, envs = request.job.role, request.job.tasks, request.envs
        need = sum(spec.gpu for spec in tasks)
        with self.gpus.lock:
            self.gpus.refuse_over_free(
                need,
                f"{role}: gpu per worker x new replicas",
                f"only {len(self.gpus.free)} GPUs are free; shrink or delete other roles",
                role,
            )
        w = self.workers
        w.specs[role] = tuple(w.specs[role]) + tuple(tasks)
        for i, (spec, env) in enumerate(zip(tasks, envs, strict=True)):
            devices = self.gpus.take(spec.gpu)
            w.gpus[role].append(devices)
            w.procs[role].append(self.start(role, first + i, spec, env, devices))

    def shrink(self, role: str, indices: list[int]) -> None:
        keep, w = min(indices), self.workers
        stop_process_groups(w.procs[role][keep:])
        self.gpus.give_back(w.gpus[role][keep:])
        del w.procs[role][keep:]
        del w.gpus[role][keep:]
        w.specs[role] = tuple(w.specs[role])[:keep]


class LocalAdoption(Adoptable):
    """Workers of a dead controller's run, adopted by the pid they registered (same host)."""

    def __init__(self, workers: LocalWorkers, host: str):
        self.workers, self.host = workers, host

    def adopt(self, role: str, workers: list, log_dir: str) -> None:
        self.workers.log_dir = log_dir
        for worker in workers:
            if not worker.pid or worker.host not in ("", self.host):
                raise SchedulerError(
                    f"cannot adopt {worker.id}: it runs on {worker.host!r} with pid "
                    f"{worker.pid}, not on this host ({self.host}); attach from that host"
                )
        self.workers.procs[role] = [
            AdoptedProcess(
                int(w.pid),
                partial(identity.matches, role=role, index=str(w.index), log_dir=log_dir),
            )
            for w in workers
        ]
        self.workers.gpus[role] = [[] for _ in workers]  # its GPUs stay with the old run's
        self.workers.specs[role] = tuple(SchedulingSpec() for _ in workers)


class LocalCommands(ServesCommands):
    """Where a worker command (``spec.cmd``) was told to serve: its ``--port``."""

    def __init__(self, workers: LocalWorkers):
        self.workers = workers

    def served_at(self, role: str, index: int) -> ServedAt | None:
        return self.workers.served.get((role, index))


class LocalLauncher(Launcher):
    """Worker processes on this machine: ``gpus`` is the GPU ledger, ``workers`` what runs;
    the parts (elastic, adoption, commands) share both."""

    name = "local"
    # its output pipe and the connection of a call fan-out; log files are shared by all
    # workers, at most 16 open (corral.logs.OpenFiles): within fdlimit.MARGIN
    fds_per_worker = 2

    def __init__(self, gpu_devices: list[int] | None = None, gpu_sharing: str = "exclusive"):
        devices = detect_gpu_devices() if gpu_devices is None else list(gpu_devices)
        if len(set(devices)) != len(devices) or any(
            not isinstance(d, int) or d < 0 for d in devices
        ):
            raise ConfigError("gpu_devices", gpu_devices, "use a list of distinct GPU indices >= 0")
        if gpu_sharing not in GPU_SHARING:
            raise ConfigError("gpu_sharing", gpu_sharing, f"use one of {', '.join(GPU_SHARING)}")
        if gpu_sharing == "round_robin":
            log.warning(
                "gpu_sharing='round_robin': GPUs are handed out in turn and may be shared by "
                "several workers (AReaL's behaviour); workers can run out of GPU memory"
            )
        self.devices = devices
        self.gpus = GpuLedger(devices, gpu_sharing)
        self.workers = LocalWorkers()
        self.host = socket.gethostname()
        self.news = threading.Event()
        self._pump = LogPump(on_error=lambda text: self.progress(text), on_output=self.news.set)
        self.elastic = LocalElastic(self.workers, self.gpus, self._start)
        self.adoption = LocalAdoption(self.workers, self.host)
        self.commands = LocalCommands(self.workers)

    def check(self, job: NormalizedJob) -> None:
        # round robin: each worker's own request was checked against the node's GPU count
        self.gpus.refuse_over_free(
            job.total_gpus,
            f"{job.role}: gpu per worker x replicas",
            f"only {len(self.gpus.free)} of {len(self.devices)} GPUs are free on this machine "
            f"(devices {self.devices}); lower gpu/replicas, delete other roles, or declare "
            "devices with gpu_devices=[...]",
            job.role,
        )

    def describe(self, request: LaunchRequest) -> str:
        """Each worker's argv, GPUs (as free now; taken at launch) and environment."""
        job = request.job
        lines = [
            f"# dry run (local): {job.replicas} {job.role} worker process(es) on this "
            f"machine; logs in {request.log_dir}"
        ]
        picked = self.gpus.preview([spec.gpu for spec in job.tasks])
        for index, (spec, env, devices) in enumerate(
            zip(job.tasks, request.envs, picked, strict=True)
        ):
            env = self._process_env(env, devices)
            argv = _argv(spec, env, port=0)
            lines += [
                f"## {job.role}/{index}: GPUs {devices or 'none'}",
                "$ " + shlex.join(argv) + ("  (--port: a free port at launch)" if spec.cmd else ""),
                "  environment:",
                *env_lines(env),
            ]
        return "\n".join(lines)

    def launch(self, request: LaunchRequest) -> None:
        job, w = request.job, self.workers
        procs = []
        taken: list[list[int]] = []
        w.log_dir = request.log_dir
        try:
            for index, (spec, env) in enumerate(zip(job.tasks, request.envs, strict=True)):
                devices = self.gpus.take(spec.gpu)
                taken.append(devices)
                procs.append(self._start(job.role, index, spec, env, devices))
        finally:
            w.procs[job.role] = procs
            w.gpus[job.role] = taken
            w.specs[job.role] = job.tasks

    @staticmethod
    def _process_env(env: dict[str, str], devices: list[int]) -> dict[str, str]:
        env = dict(env)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, devices))
        return env

    def _start(self, role: str, index: int, spec, env: dict[str, str], devices: list[int]):
        env = self._process_env(env, devices)
        ports = free_ports(max(spec.port_count, 1)) if spec.cmd else [0]
        argv = _argv(spec, env, port=ports[0])
        proc = self._spawn(role, index, argv, env)
        if spec.cmd:
            self.workers.served[(role, index)] = ServedAt(
                advertise_host(), ports, self.host, proc.pid
            )
        return proc

    def _spawn(self, role: str, index: int, argv: list[str], env: dict[str, str]):
        log_dir = self.workers.log_dir
        if self.outlive:  # outlives the controller (corral.controller.adoption): writes its own log
            path = replica_log_path(log_dir, role, index)
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as log:
                return spawn(argv, env, stdout=log)
        env[E.DIE_WITH_PARENT] = "1"
        proc = spawn(argv, env)
        self._pump.add(proc.stdout, log_dir, role, index)
        return proc

    def restart(self, role: str, index: int, env: dict[str, str]) -> None:
        w = self.workers
        stop_process_groups([w.procs[role][index]], grace=1.0)
        spec = w.specs[role][index]
        w.procs[role][index] = self._start(role, index, spec, env, w.gpus[role][index])

    def poll(self, role: str) -> dict[int, WorkerExit]:
        dead = {}
        for index, proc in enumerate(self.workers.procs.get(role, [])):
            code = proc.poll()
            if code is not None:
                path = replica_log_path(self.workers.log_dir, role, index)
                if getattr(proc, "adopted", False):
                    why = f"exited (pid {proc.pid}, adopted on re-attach: exit code unknown)"
                    dead[index] = WorkerExit(why, None, path)
                else:
                    dead[index] = WorkerExit(describe_returncode(code), code, path)
        if dead:
            self._pump.flush_closed(0.3)
        return dead

    def stop(self, role: str, reverse: bool = False) -> None:
        w = self.workers
        procs = w.procs.pop(role, [])
        for index in range(len(procs)):
            w.served.pop((role, index), None)
        if reverse:
            for proc in reversed(procs):
                stop_process_groups([proc])
        stop_process_groups(procs)
        w.specs.pop(role, None)
        self.gpus.give_back(w.gpus.pop(role, []))

    def pids(self, role: str) -> list[int]:
        return [p.pid for p in self.workers.procs.get(role, [])]

    def close(self) -> None:
        for role in list(self.workers.procs):
            self.stop(role)


class LocalScheduler(Scheduler):
    """Workers are subprocesses of this machine. ``gpu_devices`` declares GPU indices
    (works without physical GPUs); by default they are detected.

    The signature is AReaL's ``LocalScheduler``; corral's own options (``progress``,
    ``name_resolve``, ``lease_timeout``, ``n_gpus_per_node``) are further keywords. An
    experiment config given first is taken as ``exp_config`` (corral's older form).
    Unlike AReaL, GPUs are given exclusively: a request beyond the free devices is refused
    (AReaL's round-robin sharing: ``gpu_sharing="round_robin"``, see docs/areal.md).
    """

    backend = "local"

    @opts.config_first
    def __init__(
        self,
        gpu_devices: list[int] | None = None,
        log_dir: str | None = None,
        startup_timeout: float | None = None,
        health_check_interval: float | None = None,
        *,
        experiment_name: str | None = None,
        trial_name: str | None = None,
        fileroot: str | None = None,
        enable_tms_offload: bool | None = None,
        name_resolve_type: str | None = None,
        nfs_record_root: str | None = None,
        etcd3_addr: str | None = None,
        exp_config: Any = None,
        gpu_sharing: str = "exclusive",
        **kwargs: Any,
    ):
        if exp_config is None and opts.looks_like_config(gpu_devices):
            exp_config, gpu_devices = gpu_devices, None
        gpu_devices = opts.check_gpu_devices(gpu_devices)
        opts.check_exp_config(exp_config)
        if gpu_devices is None:
            gpu_devices = cluster_field(exp_config, "gpu_devices")
        declared = kwargs.get("n_gpus_per_node") is not None
        super().__init__(
            exp_config,
            launcher=LocalLauncher(gpu_devices, gpu_sharing),
            startup_timeout=startup_timeout,
            log_dir=log_dir,
            health_check_interval=health_check_interval,
            experiment_name=experiment_name,
            trial_name=trial_name,
            fileroot=fileroot,
            enable_tms_offload=enable_tms_offload,
            name_resolve_type=name_resolve_type,
            nfs_record_root=nfs_record_root,
            etcd3_addr=etcd3_addr,
            **kwargs,
        )
        if not declared and self.launcher.devices:
            # AReaL: this machine is the node and its GPUs are gpu_devices (none declared:
            # the cluster config's figure stands)
            self.n_gpus_per_node = len(self.launcher.devices)

    @property
    def gpu_devices(self) -> list[int]:
        """The GPU indices this scheduler hands out (declared or detected)."""
        return list(self.launcher.devices)
