"""Where the time goes: profiles and A/B trials of proposed core changes, without editing the core.

    python benchmarks/hotspots.py payload [--mib 128] [--reps 5] [--top 25] [--patch NAME]
    python benchmarks/hotspots.py noop [--reps 2000] [--patch NAME]
    python benchmarks/hotspots.py start [--replicas 8]
    python benchmarks/hotspots.py delete [--replicas 8]
    python benchmarks/hotspots.py ab [--mib 128] [--reps 8]
    python benchmarks/hotspots.py ab-noop [--reps 4000]
    python benchmarks/hotspots.py fanout [--replicas 8] [--reps 4000]

``payload`` / ``noop``: cProfile of the controller (in-process) and of one worker, which runs
as ``hotspots.py worker`` and profiles every thread it starts (connection threads, the
engine thread), writing the merged profile when delete_workers stops it.

``start``: the controller's profile of create_workers, and what a worker imports before it
can serve (``-X importtime``).

``delete``: wall time of each phase of delete_workers, and its controller profile.

``ab``: the 128 MiB echo with the core as it is and with each patch in ``PATCHES`` applied
on both sides (controller and a worker started with the same patch), plus a raw-socket round
trip, interleaved call by call so every arm sees the same background noise.

``fanout``: the controller's cProfile of async fan-outs (``--reps`` calls per gather over
``--replicas`` echo workers), and the controller's CPU time per call (process time: on a
loaded machine it moves much less than the wall time), with the call statistics on and off.

``ab-noop``: noop latency with the core's engine-thread hop and with each of ``HOPS``
applied in the worker, plus the raw ping-pong, in interleaved blocks.

A diagnostic tool: its figures are not part of the results table.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import mmap
import os
import pstats
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
PATCH_MIN_BYTES = 1 << 20


# ------------------------------------------------------------------ proposed changes
def _alloc_mmap(length: int):
    return mmap.mmap(-1, length)


def _alloc_numpy(length: int):
    return memoryview(np.empty(length, dtype=np.uint8))


def make_read_body(alloc: Callable[[int], object]):
    """A SocketReader.read_body that receives a large body into ``alloc(length)``."""
    from corral.rpc import http

    original = http.SocketReader.read_body

    def read_body(self, length: int):
        if length < PATCH_MIN_BYTES or length <= len(self.pending):
            return original(self, length)
        body = alloc(length)
        _fill(self, memoryview(body).cast("B"), length)
        return body

    return read_body


def _fill(reader, view: memoryview, length: int) -> None:
    have = len(reader.pending)
    view[:have] = reader.pending
    reader.pending = bytearray()
    while have < length:
        n = reader.sock.recv_into(view[have:], min(length - have, 1 << 24))
        if n == 0:
            raise ConnectionResetError(f"peer closed after {have} of {length} body bytes")
        have += n


def make_reuse_read_body():
    """A SocketReader.read_body that reuses one of its last two large bodies when nothing
    (no decoded array, no cached reply) refers to it any more; else a new bytearray."""
    from corral.rpc import http

    original = http.SocketReader.read_body

    def read_body(self, length: int):
        if length < PATCH_MIN_BYTES or length <= len(self.pending):
            return original(self, length)
        pool = self.__dict__.setdefault("_spare_bodies", [])
        body = None
        for buf in pool:
            # references: the pool, the loop variable, getrefcount's argument
            if len(buf) == length and sys.getrefcount(buf) == 3:
                body = buf
                break
        if body is None:
            body = bytearray(length)
            pool.append(body)
            del pool[:-2]
        _fill(self, memoryview(body), length)
        return body

    return read_body


# name -> a replacement for SocketReader.read_body (bodies >= 1 MiB). The core today
# allocates bytearray(length) for every body, which zero-fills every page first.
PATCHES: dict[str, Callable[[], Callable]] = {
    # anonymous mmap: no memset, 4 KiB page faults while the kernel copies in
    "mmap-body": lambda: make_read_body(_alloc_mmap),
    # np.empty: no memset; numpy advises huge pages for large arrays (few faults)
    "np-body": lambda: make_read_body(_alloc_numpy),
    # reuse a body nobody refers to any more: no allocation, no faults in steady state
    "reuse-body": make_reuse_read_body,
}


def _inline_hop() -> None:
    """Synchronous engine methods run on the connection thread, one at a time (a lock keeps
    them in order), with no thread hop: the upper bound of what removing the hop saves. Not
    a change corral can make as is: engine code may rely on running on one thread (CUDA's
    current device, torch's grad mode and NCCL state are per thread)."""
    from corral.worker import engines

    lock = threading.Lock()

    def on_engine_thread(self, fn, *args, **kwargs):
        with lock:
            return fn(*args, **kwargs)

    def submit(self, task) -> None:  # a /call's reply task (worker/replies.py), run here
        lease, task.lease = task.lease, None  # no lent connection: its thread reads on
        with lock:
            task.run()
        if lease is not None:
            lease.give_back()

    engines.EngineHost._on_engine_thread = on_engine_thread
    engines.EngineHost.submit = submit


def _no_lending() -> None:
    """The connection's thread reads every request and hands each engine call to the engine
    thread (corral before lent connections, ``rpc/connection.py``): the hop's cost."""
    from corral.worker import runtime

    runtime.WorkerRuntime._lendable = lambda self, msg: False


# Worker-only changes to the engine-thread hop, tried by ``ab-noop``.
HOPS: dict[str, Callable[[], None]] = {"inline": _inline_hop, "no-lending": _no_lending}


def apply_patch(name: str | None) -> None:
    if name in HOPS:
        HOPS[name]()
    elif name:
        from corral.rpc import http

        http.SocketReader.read_body = PATCHES[name]()


def ab_noop(sched, args) -> None:
    """noop p50 with the core's engine hop and with each of ``HOPS`` (worker side), plus
    the raw ping-pong, in interleaved blocks."""
    sys.path.insert(0, HERE)
    import baselines

    arms = {"core as is": _start_echo(sched, "plain", None)}
    for name in HOPS:
        arms[name] = _start_echo(sched, f"ab-{name}", worker_cmd(os.devnull, name))
    server = baselines.EchoServer()
    lat: dict[str, list[float]] = {name: [] for name in [*arms, "raw ping-pong"]}
    block = 200
    try:
        for wid in arms.values():
            for _ in range(200):
                sched.call_engine(wid, "noop")
        for _ in range(max(1, (args.reps or 4000) // block)):
            for name, wid in arms.items():
                for _ in range(block):
                    started = time.perf_counter()
                    sched.call_engine(wid, "noop")
                    lat[name].append(time.perf_counter() - started)
            lat["raw ping-pong"] += baselines.pingpong(server.port, 356, 118, 20, block)
    finally:
        server.stop()
    for name, xs in lat.items():
        xs.sort()
        p50, p99 = xs[len(xs) // 2], xs[int(len(xs) * 0.99)]
        print(f"{name:14s} noop p50 {p50 * 1e6:7.1f} us  p99 {p99 * 1e6:8.1f} us  (n={len(xs)})")


# ------------------------------------------------------------------ the profiled worker
def run_worker(out: str, patch: str | None, worker_argv: list[str]) -> None:
    """``hotspots.py worker``: a corral worker with every thread profiled; ``worker_argv``
    is the worker contract's arguments that the launcher appends to the command."""
    apply_patch(patch)
    from corral.worker.runtime import main as worker_main

    if out == os.devnull:  # a patched arm of an A/B: measured, so not profiled
        worker_main(worker_argv)
        return
    profiles: list[cProfile.Profile] = []

    def boot(frame, event, arg) -> None:
        sys.setprofile(None)
        prof = cProfile.Profile()
        profiles.append(prof)
        prof.enable()

    threading.setprofile(boot)
    main_prof = cProfile.Profile()
    main_prof.enable()
    try:
        worker_main(worker_argv)
    finally:
        main_prof.disable()
        stats = pstats.Stats(main_prof)
        for prof in profiles:
            try:
                stats.add(prof)
            except TypeError:
                pass
        if out != os.devnull:
            stats.dump_stats(out)


def worker_cmd(profile_out: str, patch: str | None) -> str:
    cmd = f"{sys.executable} {os.path.abspath(__file__)} worker --profile-out {profile_out}"
    return cmd + (f" --patch {patch}" if patch else "")


# ------------------------------------------------------------------ helpers
def _stats(prof: cProfile.Profile | str, top: int, title: str) -> None:
    for order, what in (("cumulative", "cumulative time"), ("tottime", "own time")):
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats(order).print_stats(top)
        print(f"\n===== {title}: by {what} =====")
        print(out.getvalue())


def _scheduler(fileroot: str):
    from corral.backends.local import LocalScheduler
    from corral.config import BaseExperimentConfig

    cfg = BaseExperimentConfig(experiment_name=f"hotspots-{os.getpid()}", trial_name="t0")
    return LocalScheduler(
        exp_config=cfg, gpu_devices=[], fileroot=fileroot, progress=lambda t: None
    )


def _job(role: str, replicas: int, cmd: str | None):
    """``cmd``: the worker's command (``worker_cmd``: a profiled or patched worker); None
    for corral's own ``python -m corral.worker``."""
    from corral import Job, SchedulingSpec

    return Job(role=role, replicas=replicas, tasks=[SchedulingSpec(cpu=1, gpu=0, cmd=cmd)])


def _start_echo(sched, role: str, cmd: str | None) -> str:
    (wid,) = sched.create_workers(_job(role, 1, cmd))
    asyncio.run(sched.create_engine(wid, "corral.testing.engines.EchoEngine"))
    return wid


# ------------------------------------------------------------------ modes
def profile_calls(sched, fileroot: str, args) -> None:
    worker_prof = os.path.join(fileroot, "worker.prof")
    apply_patch(args.patch)
    wid = _start_echo(sched, "prof", worker_cmd(worker_prof, args.patch))
    prof = cProfile.Profile()
    if args.what == "payload":
        value = np.arange(args.mib * (1 << 20) // 4, dtype=np.float32)
        sched.call_engine(wid, "echo", None, value)
        reps = args.reps or 5
        started = time.perf_counter()
        prof.enable()
        for _ in range(reps):
            sched.call_engine(wid, "echo", None, value)
        prof.disable()
        each = (time.perf_counter() - started) / reps
        rate = 2 * value.nbytes / each / 1e9
        print(f"{args.mib} MiB echo (profiled): {each * 1e3:.1f} ms each, {rate:.2f} GB/s")
    else:
        for _ in range(200):
            sched.call_engine(wid, "noop")
        reps = args.reps or 2000
        started = time.perf_counter()
        prof.enable()
        for _ in range(reps):
            sched.call_engine(wid, "noop")
        prof.disable()
        each = (time.perf_counter() - started) / reps
        print(f"noop (profiled): {each * 1e6:.1f} us each")
    sched.delete_workers()
    _stats(prof, args.top, "controller")
    if os.path.exists(worker_prof):
        _stats(worker_prof, args.top, "worker (all threads, whole life)")
    else:
        print("the worker wrote no profile")


def profile_fanout(sched, args) -> None:
    """Controller CPU per call of one async fan-out (stats on / off), then its profile."""
    from corral import Job, SchedulingSpec
    from corral.observe.call_stats import CallStats, NullCallStats

    job = Job(role="fan", replicas=args.replicas, tasks=[SchedulingSpec(cpu=1, gpu=0)])
    ids = sched.create_workers(job)

    async def engines() -> None:
        await asyncio.gather(
            *(sched.create_engine(w, "corral.testing.engines.EchoEngine") for w in ids)
        )

    asyncio.run(engines())
    n = args.reps or 4000
    caller = sched.parts.caller

    async def gather() -> None:
        await asyncio.gather(
            *(sched.async_call_engine(ids[i % len(ids)], "noop") for i in range(n))
        )

    pids = sorted({w.pid for w in sched.get_workers("fan") if w.pid})

    def workers_cpu() -> float:
        """CPU seconds of the workers so far (/proc, clock ticks)."""
        total = 0
        for pid in pids:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        return total / os.sysconf("SC_CLK_TCK")

    async def timed(rounds: int) -> None:
        await gather()  # connections open
        cpu = {"on": [], "off": []}
        wall = {"on": [], "off": []}
        worker_cpu = {"on": 0.0, "off": 0.0}
        for r in range(rounds):
            for mode in ("on", "off") if r % 2 == 0 else ("off", "on"):
                caller.stats = CallStats() if mode == "on" else NullCallStats()
                c0, w0, k0 = time.process_time(), time.perf_counter(), workers_cpu()
                await gather()
                cpu[mode].append((time.process_time() - c0) / n)
                wall[mode].append(n / (time.perf_counter() - w0))
                worker_cpu[mode] += workers_cpu() - k0
        each = worker_cpu["off"] / (n * rounds)
        print(f"workers: CPU {each * 1e6:6.1f} us/call (all {len(pids)}, stats off rounds)")
        for mode in ("on", "off"):
            cpu[mode].sort()
            wall[mode].sort()
            print(
                f"stats {mode:3s}: controller CPU {cpu[mode][len(cpu[mode]) // 2] * 1e6:6.1f} us/call "
                f"(min {cpu[mode][0] * 1e6:.1f}), {wall[mode][len(wall[mode]) // 2]:,.0f} calls/s"
            )
        prof = cProfile.Profile(time.process_time)  # CPU time: the machine may be loaded
        prof.enable()
        await gather()
        prof.disable()
        _stats(prof, args.top, f"controller CPU, one fan-out of {n} calls")

    asyncio.run(timed(6))
    sched.delete_workers()


def ab_payload(sched, args) -> None:
    sys.path.insert(0, HERE)
    import baselines

    from corral.rpc import http

    plain = http.SocketReader.read_body
    arms: dict[str, tuple[str, Callable]] = {
        "core as is": (_start_echo(sched, "plain", None), plain)
    }
    for name, factory in PATCHES.items():
        wid = _start_echo(sched, f"ab-{name}", worker_cmd(os.devnull, name))
        arms[name] = (wid, factory())
    nbytes = args.mib * (1 << 20)
    value = np.arange(nbytes // 4, dtype=np.float32)
    server = baselines.EchoServer()
    raw = baselines.RawClient(server.port, nbytes)
    times: dict[str, list[float]] = {name: [] for name in [*arms, "raw socket"]}
    try:
        for i in range((args.reps or 8) + 1):
            for name, (wid, read_body) in arms.items():
                http.SocketReader.read_body = read_body
                started = time.perf_counter()
                sched.call_engine(wid, "echo", None, value)
                if i:
                    times[name].append(time.perf_counter() - started)
            http.SocketReader.read_body = plain
            elapsed = raw.roundtrip(nbytes)
            if i:
                times["raw socket"].append(elapsed)
    finally:
        http.SocketReader.read_body = plain
        raw.close()
        server.stop()
    for name, xs in times.items():
        xs.sort()
        med = xs[len(xs) // 2]
        print(
            f"{name:12s} {args.mib} MiB round trip: median {med * 1e3:7.1f} ms = "
            f"{2 * nbytes / med / 1e9:5.2f} GB/s (min {xs[0] * 1e3:.1f}, max {xs[-1] * 1e3:.1f})"
        )


def profile_start(sched, args) -> None:
    prof = cProfile.Profile()
    started = time.perf_counter()
    prof.enable()
    sched.create_workers(_job("start", args.replicas, None))
    prof.disable()
    print(f"create_workers({args.replicas}): {time.perf_counter() - started:.3f} s")
    sched.delete_workers()
    _stats(prof, args.top, "controller create_workers")
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import corral.worker.runtime"],
        capture_output=True,
        text=True,
    ).stderr.splitlines()
    rows = []
    for line in out:
        parts = line.split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            rows.append((int(parts[1]), parts[2].rstrip()))
    total = max(us for us, _ in rows)
    print(f"\n===== worker imports (-X importtime), total {total / 1e3:.0f} ms =====")
    for us, name in rows:
        depth = (len(name) - len(name.lstrip())) // 2
        if depth <= 2 and us > 2000:
            print(f"{us / 1e3:8.1f} ms  {name}")
    what_if_imports(args.replicas, args.reps or 7)


# What a worker's imports would cost if wire.py imported numpy only when it meets an array
# (and engines.py asyncio only for a coroutine engine): the same import with those modules
# stubbed out, which wire.py and engines.py do not touch at import time.
_STUB = "import sys, types; [sys.modules.setdefault(m, types.ModuleType(m)) for m in {mods!r}]; "
IMPORT_VARIANTS = {
    "python -c pass": "pass",
    "import corral.worker.runtime": "import corral.worker.runtime",
    "... without numpy": _STUB.format(mods=["numpy"]) + "import corral.worker.runtime",
}


def what_if_imports(n: int, reps: int) -> None:
    sys.path.insert(0, HERE)
    import baselines

    times: dict[str, list[float]] = {name: [] for name in IMPORT_VARIANTS}
    for _ in range(reps):
        for name, code in IMPORT_VARIANTS.items():
            times[name].append(baselines.bare_start(n, code, baselines.WORKER_THREAD_ENV))
    print(f"\n===== {n} processes in parallel, median of {reps} (interleaved) =====")
    base = sorted(times["python -c pass"])[reps // 2]
    for name, xs in times.items():
        med = sorted(xs)[reps // 2]
        print(f"{name:32s} {med:6.3f} s  ({med / base:4.1f}x python -c pass)")


def profile_delete(sched, args) -> None:
    """Wall time of each phase of delete_workers (whatever phases the core has today)."""
    ids = sched.create_workers(_job("del", args.replicas, None))

    async def engines() -> None:
        await asyncio.gather(
            *(sched.create_engine(i, "corral.testing.engines.EchoEngine") for i in ids)
        )

    asyncio.run(engines())
    spans: dict[str, list[float]] = {}

    def timed(name: str, fn: Callable) -> Callable:
        def wrapper(*a, **k):
            started = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spans.setdefault(name, []).append(time.perf_counter() - started)

        return wrapper

    for name in ("_destroy_engines_quietly", "_ask_to_exit", "_fan_out", "_stop_launched"):
        if hasattr(sched, name):
            setattr(sched, name, timed(name, getattr(sched, name)))
    sched.launcher.stop = timed("launcher.stop", sched.launcher.stop)
    prof = cProfile.Profile()
    started = time.perf_counter()
    prof.enable()
    sched.delete_workers("del")
    prof.disable()
    total = time.perf_counter() - started
    print(f"delete_workers({args.replicas}): {total * 1e3:.1f} ms")
    for name, xs in spans.items():
        print(
            f"  {name:26s} calls {len(xs):3d}  sum {sum(xs) * 1e3:7.1f} ms  "
            f"max {max(xs) * 1e3:7.1f} ms"
        )
    _stats(prof, args.top, "controller delete_workers")


def main() -> None:
    # no abbreviations: a worker's command line ends with the worker contract's arguments
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument(
        "what",
        choices=["payload", "noop", "fanout", "start", "delete", "ab", "ab-noop", "worker"],
    )
    parser.add_argument("--patch", choices=sorted([*PATCHES, *HOPS]), default=None)
    parser.add_argument("--profile-out", default=os.devnull, help=argparse.SUPPRESS)
    parser.add_argument("--mib", type=int, default=128)
    parser.add_argument("--reps", type=int, default=0)
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--top", type=int, default=25)
    args, rest = parser.parse_known_args()
    if args.what == "worker":
        run_worker(args.profile_out, args.patch, rest)
        return
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    fileroot = tempfile.mkdtemp(prefix="corral-hotspots-", dir="/tmp")
    sched = _scheduler(fileroot)
    try:
        if args.what == "start":
            profile_start(sched, args)
        elif args.what == "delete":
            profile_delete(sched, args)
        elif args.what == "ab-noop":
            ab_noop(sched, args)
        elif args.what == "fanout":
            profile_fanout(sched, args)
        elif args.what == "ab":
            ab_payload(sched, args)
        else:
            profile_calls(sched, fileroot, args)
    finally:
        sched.close()
        shutil.rmtree(fileroot, ignore_errors=True)


if __name__ == "__main__":
    main()
