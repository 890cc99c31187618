"""The controller's cost curve at 1,024 and 4,096 workers (simulated, real protocol).

Each size runs a real ``Scheduler`` (name-resolve on files, as by default) whose launcher
starts a few host processes (``sim_host.py``), each serving a few hundred lightweight
workers: real ``WorkerRuntime`` RPC servers on their own ports, registering in the real
name-resolve. Measured on the controller, for each size N:

* ``scale.register.nN``  create_workers until all N are registered and have their
  rendezvous variables
* ``scale.fanout.nN``    one ``asyncio.gather`` of N ``async_call_engine`` noops, one per
  worker, on connections already open (the first round, which opens them, is in extra)
* ``scale.delete.nN``    delete_workers of the N (engines destroyed, each asked to exit,
  hosts stopped)
* ``scale.fds_per_worker.nN`` / ``scale.rss_per_worker.nN``  controller descriptors and
  resident memory added per worker, after the fan-out
* ``scale.threads.nN``   threads the controller started for this scheduler (counted
  after the fan-out, against the count before the scheduler was made)
* ``scale.local_fds_per_worker.nN``  real local worker processes (``LocalScheduler``,
  N = 32, quick 16): the pipes and sockets the controller added per worker after three
  fan-out rounds, against the open-file pre-check's estimate
  (``LocalLauncher.fds_per_worker``; ratio <= 1: the check never under-counts, so what it
  admits runs)

Baselines: for the N=4,096 times, 4 x the N=1,024 figure of the same run (ratio 1.0 =
linear); for threads, the thread count at N=1,024 (ratio 1.0 = constant).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

from common import Context, Row, Target, log, rounded

NAME = "scale"
HERE = os.path.dirname(os.path.abspath(__file__))
ENGINE = "corral.testing.engines.EchoEngine"
PER_HOST = 256


class Plan:
    def __init__(self, quick: bool):
        self.sizes = [128, 512] if quick else [1024, 4096]
        self.real_local = 16 if quick else 32


def check() -> str | None:
    return None


def _launcher_class():
    from corral.launcher import Launcher, WorkerExit

    class SimLauncher(Launcher):
        """Starts ``ceil(N / PER_HOST)`` sim_host.py processes for a role."""

        name = "sim"

        def __init__(self, folder: str):
            self.folder = folder
            self.hosts: dict[str, list[tuple[subprocess.Popen, range]]] = {}
            self.killed = 0  # hosts that did not exit within 10 s of SIGTERM

        def launch(self, request) -> None:
            job, hosts = request.job, []
            for first in range(0, job.replicas, PER_HOST):
                count = min(PER_HOST, job.replicas - first)
                env = {k: v for k, v in request.envs[first].items() if k != "CORRAL_INDEX"}
                path = os.path.join(self.folder, f"{job.role}-{first}.json")
                with open(path, "w") as fh:
                    json.dump({"env": env, "first": first, "count": count, "engine": ENGINE}, fh)
                with open(os.path.join(self.folder, f"{job.role}-{first}.log"), "ab") as out:
                    proc = subprocess.Popen(
                        [sys.executable, os.path.join(HERE, "sim_host.py"), path],
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                hosts.append((proc, range(first, first + count)))
            self.hosts[job.role] = hosts

        def poll(self, role: str) -> dict:
            dead = {}
            for proc, indices in self.hosts.get(role, []):
                code = proc.poll()
                if code is not None:
                    dead.update(
                        {i: WorkerExit(f"sim host exited with {code}", code) for i in indices}
                    )
            return dead

        def stop(self, role: str, reverse: bool = False) -> None:
            hosts = self.hosts.pop(role, [])
            for proc, _ in hosts:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc, _ in hosts:
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    self.killed += 1
                    proc.kill()
                    proc.wait()

        def close(self) -> None:
            for role in list(self.hosts):
                self.stop(role)

    return SimLauncher


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure(ctx: Context, n: int) -> dict:
    from corral.config import BaseExperimentConfig
    from corral.controller.scheduler import Scheduler

    folder = os.path.join(ctx.fileroot, f"scale-{n}")
    os.makedirs(folder, exist_ok=True)
    cfg = BaseExperimentConfig(experiment_name=ctx.unique_name("scale"), trial_name="t0")
    launcher = _launcher_class()(folder)
    sched = Scheduler(
        cfg,
        launcher=launcher,
        fileroot=ctx.fileroot,
        startup_timeout=600.0,
        progress=lambda text: None,
    )
    ctx.on_close(sched.close)
    from corral import Job, SchedulingSpec

    fds0, rss0, threads0 = _fds(), _rss(), _threads()
    started = time.perf_counter()
    ids = sched.create_workers(Job(role="sim", replicas=n, tasks=[SchedulingSpec(cpu=0)]))
    register = time.perf_counter() - started

    async def round_trip() -> float:
        t0 = time.perf_counter()
        out = await asyncio.gather(*(sched.async_call_engine(i, "noop", "main") for i in ids))
        assert out == [None] * n
        return time.perf_counter() - t0

    async def rounds() -> tuple[float, list[float]]:
        first = await round_trip()
        return first, [await round_trip() for _ in range(5)]

    loop = asyncio.new_event_loop()  # kept open: its connections stay pooled, as in a real job
    try:
        first, again = loop.run_until_complete(rounds())
        fds, rss, threads = _fds() - fds0, _rss() - rss0, _threads() - threads0
    finally:
        loop.run_until_complete(sched.parts.caller.async_client.aclose())
        loop.close()
    started = time.perf_counter()
    sched.delete_workers("sim")
    delete = time.perf_counter() - started
    sched.close()
    result = {
        "n": n,
        "register_s": register,
        "fanout_first_s": first,
        "fanout_s": sorted(again)[len(again) // 2],
        "fanout_samples_s": rounded(again),
        "delete_s": delete,
        "fds_per_worker": fds / n,
        "rss_per_worker_bytes": rss / n,
        "threads": threads,
        "hosts": -(-n // PER_HOST),
        "hosts_killed_after_10s": launcher.killed,
    }
    log(
        f"scale n={n}: register {register:.2f}s, fan-out {result['fanout_s']:.3f}s (first "
        f"{first:.3f}s), delete {delete:.2f}s, {result['fds_per_worker']:.2f} fds and "
        f"{rss / n / 1024:.1f} KiB per worker, {threads} threads"
    )
    return result


def _pipes_and_sockets() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith(("pipe:", "socket:"))
        except OSError:
            pass
    return count


def measure_real_local(ctx: Context, n: int) -> Row:
    """Real worker processes: what each costs the controller in descriptors."""
    from corral import Job, LocalScheduler
    from corral.config import BaseExperimentConfig

    cfg = BaseExperimentConfig(experiment_name=ctx.unique_name("scale-real"), trial_name="t0")
    sched = LocalScheduler(
        gpu_devices=[], exp_config=cfg, fileroot=ctx.fileroot, progress=lambda text: None
    )
    ctx.on_close(sched.close)
    sched.create_workers(Job(role="warm", replicas=1))

    async def rounds() -> tuple[int, int]:
        await sched.create_engine("warm/0", ENGINE, "main")
        await sched.async_call_engine("warm/0", "noop", "main")
        before = _pipes_and_sockets()  # this loop, the clients and a worker: fixed costs
        ids = await asyncio.to_thread(sched.create_workers, Job(role="real", replicas=n))
        await asyncio.gather(*(sched.create_engine(i, ENGINE, "main") for i in ids))
        for _ in range(3):
            await asyncio.gather(*(sched.async_call_engine(i, "noop", "main") for i in ids))
        return before, _pipes_and_sockets()

    before, after = asyncio.run(rounds())
    estimate = sched.launcher.fds_per_worker
    sched.close()
    per_worker = (after - before) / n
    log(f"scale real local n={n}: {per_worker:.2f} fds per worker (estimate {estimate})")
    return Row(
        key=f"scale.local_fds_per_worker.n{n}",
        backend=NAME,
        label=f"scale: controller pipes and sockets per real local worker, {n} workers",
        unit="fds",
        value=per_worker,
        baseline=float(estimate),
        baseline_label="the open-file pre-check's estimate (LocalLauncher.fds_per_worker)",
        targets=[Target("ratio", "<=", 1.0, "<= the pre-check's estimate")],
        extra={"n": n, "before": before, "after": after},
    )


def run(ctx: Context) -> list[Row]:
    plan = Plan(ctx.quick)
    real = measure_real_local(ctx, plan.real_local)
    small, big = (measure(ctx, n) for n in plan.sizes)
    k = big["n"] / small["n"]
    ns, nb = small["n"], big["n"]
    rows = []
    for key, label in (
        ("register", "create_workers until all are registered"),
        ("fanout", "one fan-out round, one noop call per worker"),
        ("delete", "delete_workers"),
    ):
        for r in (small, big):
            rows.append(
                Row(
                    key=f"scale.{key}.n{r['n']}",
                    backend=NAME,
                    label=f"scale: {label}, {r['n']:,} simulated workers",
                    unit="s",
                    value=r[f"{key}_s"],
                    baseline=small[f"{key}_s"] * k if r is big else None,
                    baseline_label=(
                        f"{k:.0f} x the {ns:,}-worker figure (linear growth)" if r is big else ""
                    ),
                    targets=[Target("ratio", "<=", 1.5, "<= 1.5x linear")] if r is big else [],
                    extra=dict(r),
                )
            )
    for r in (small, big):
        rows.append(
            Row(
                key=f"scale.fds_per_worker.n{r['n']}",
                backend=NAME,
                label=f"scale: controller file descriptors per worker, {r['n']:,} workers",
                unit="fds",
                value=r["fds_per_worker"],
                targets=[Target("abs", "<=", 2.0, "<= 2 per worker")],
            )
        )
        rows.append(
            Row(
                key=f"scale.rss_per_worker.n{r['n']}",
                backend=NAME,
                label=f"scale: controller memory per worker, {r['n']:,} workers",
                unit="KiB",
                value=r["rss_per_worker_bytes"] / 1024,
            )
        )
    rows.append(
        Row(
            key=f"scale.threads.n{nb}",
            backend=NAME,
            label=f"scale: controller threads started, {nb:,} workers",
            unit="threads",
            value=float(big["threads"]),
            baseline=float(small["threads"]),
            baseline_label=f"threads with {ns:,} workers",
            targets=[Target("ratio", "<=", 1.0, "constant")],
        )
    )
    rows.append(real)
    return rows
