"""The data plane (issue 12): shared memory, refs, worker-to-worker, broadcast, noop cost.

Rows (keys ``data.*``), each against a baseline measured in the same run:

* ``data.shm.f32_128MiB.memcpy``  call_engine(echo) of 128 MiB, same host (shared memory),
  in GB/s (bytes sent + received) vs one in-process numpy copy per direction; target the
  round trip >= 0.5x the copy rate
* ``data.shm.f32_128MiB.tcp``     the same round trip vs the same call with shared memory
  off (the socket path as before)
* ``data.a_to_b.128MiB``          worker A's 128 MiB array to worker B: kept on A and passed
  by ref (B fetches it from A) vs returned to the controller and passed on; B reads every
  page both ways; target >= 1.8x faster
* ``data.a_to_b.controller_bytes`` bytes the controller received on the by-ref path, in %
  of the payload; target < 1 %
* ``data.broadcast.256MiB_x8``    one 256 MiB ref read by 8 workers at once vs by 1 worker;
  target <= 2x
* ``data.relay.*``                 cross-host broadcast through the relay (bench_relay.py)
* ``data.noop.p50.shm_cost``      noop call_engine p50 with shared memory on vs off
  (``CORRAL_SHM=0``), alternating child processes; target <= 1.1x
* ``data.noop.p50.vs_base``       the same vs the tree before the data plane (``BASE_COMMIT``;
  it also lacks everything landed since, such as request signing): for information
"""

from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
from bench_relay import bench_relay
from common import Context, Row, Target, log, median, rounded

NAME = "data"
MiB = 1 << 20
ENGINE = "corral.testing.data_engines.DataEngine"
#: main just before the data plane landed: the "today" of the noop comparison
BASE_COMMIT = "66f1eb8"
HERE = os.path.dirname(os.path.abspath(__file__))


def check() -> str | None:
    try:
        from corral.rpc import shm
    except Exception as exc:  # pragma: no cover
        return f"corral.rpc.shm cannot be imported: {exc}"
    return None if shm.host_token() else "shared memory is unavailable here (CORRAL_SHM=0?)"


def _scheduler(ctx: Context):
    from corral.backends.local import LocalScheduler
    from corral.config import BaseExperimentConfig

    cfg = BaseExperimentConfig(experiment_name=ctx.unique_name("data"), trial_name="t0")
    sched = LocalScheduler(
        exp_config=cfg,
        gpu_devices=[],
        fileroot=ctx.fileroot,
        startup_timeout=120.0,
        progress=lambda t: None,
    )
    ctx.on_close(sched.close)
    return sched


def _workers(sched, role: str, n: int) -> list[str]:
    from corral import Job, SchedulingSpec

    ids = sched.create_workers(Job(role=role, replicas=n, tasks=[SchedulingSpec(cpu=1)]))
    for wid in ids:
        asyncio.run(sched.create_engine(wid, ENGINE))
    return ids


def _timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def bench_shm(sched, wid: str, reps: int) -> list[Row]:
    from corral.rpc.client import RPCClient

    nbytes = 128 * MiB
    value = np.arange(nbytes // 4, dtype=np.float32)
    worker = sched.get_workers(wid.split("/")[0])[0]
    tcp = RPCClient(sched.secret)  # its own connections, never offering shared memory
    tcp.shm.token = ""
    payload = {"engine_name": None, "method": "echo", "args": [value], "kwargs": {}}
    copy_dst = np.empty_like(value)

    def roundtrip() -> None:
        back = sched.call_engine(wid, "echo", None, value)
        assert back.nbytes == nbytes and back[-1] == value[-1]

    def roundtrip_tcp() -> None:
        back = tcp.request(worker.address, "/call", payload, identity=worker.identity)
        assert back.nbytes == nbytes and back[-1] == value[-1]

    for _ in range(3):  # warm both pools
        roundtrip()
        roundtrip_tcp()
        np.copyto(copy_dst, value)
    shm_s, tcp_s, copy_s = [], [], []
    for _ in range(reps):  # interleaved: all three see the same noise
        shm_s.append(_timed(roundtrip))
        tcp_s.append(_timed(roundtrip_tcp))
        copy_s.append(_timed(lambda: np.copyto(copy_dst, value)))
    tcp.close()
    rate = [2 * nbytes / s / 1e9 for s in shm_s]
    log(f"shm 128 MiB round trip {median(rate):.2f} GB/s, copy {nbytes / median(copy_s) / 1e9:.2f}")
    return [
        Row(
            key="data.shm.f32_128MiB.memcpy",
            backend=NAME,
            label="round trip 128 MiB float32, same host (shared memory) vs memcpy",
            unit="GB/s",
            value=median(rate),
            baseline=median([nbytes / s / 1e9 for s in copy_s]),
            baseline_label="in-process numpy copy, one per direction",
            higher_is_better=True,
            targets=[Target("ratio", "<=", 2.0, ">= 0.5x memcpy")],
            samples={"corral_s": rounded(shm_s), "baseline_copy_s": rounded(copy_s)},
            extra={"nbytes": nbytes},
        ),
        Row(
            key="data.shm.f32_128MiB.tcp",
            backend=NAME,
            label="round trip 128 MiB float32, shared memory vs socket",
            unit="GB/s",
            value=median(rate),
            baseline=median([2 * nbytes / s / 1e9 for s in tcp_s]),
            baseline_label="same call, shared memory off (TCP, as before)",
            higher_is_better=True,
            samples={"corral_s": rounded(shm_s), "baseline_s": rounded(tcp_s)},
        ),
    ]


def bench_a_to_b(sched, a: str, b: str, reps: int) -> list[Row]:
    nbytes = 128 * MiB

    def received():
        return (
            sched.parts.caller.client.bytes_received
            + sched.parts.caller.async_client.bytes_received
        )  # noqa: E731

    def by_ref() -> None:
        ref = sched.call_engine(a, "array", None, nbytes, rpc_meta={"keep": True})
        sched.call_engine(b, "touch", None, ref)
        ref.free()

    def through_controller() -> None:
        value = sched.call_engine(a, "array", None, nbytes)
        sched.call_engine(b, "touch", None, value)

    for _ in range(2):
        by_ref()
        through_controller()
    ref_s, ctl_s, read = [], [], []
    for _ in range(reps):
        before = received()
        ref_s.append(_timed(by_ref))
        read.append(received() - before)
        ctl_s.append(_timed(through_controller))
        gc.collect()
    log(
        f"A->B 128 MiB: by ref {median(ref_s) * 1e3:.1f} ms, via controller {median(ctl_s) * 1e3:.1f} ms"
    )
    share = 100.0 * max(read) / nbytes
    return [
        Row(
            key="data.a_to_b.128MiB",
            backend=NAME,
            label="128 MiB from worker A to worker B, by ref (B fetches from A)",
            unit="s",
            value=median(ref_s),
            baseline=median(ctl_s),
            baseline_label="A returns it to the controller, which passes it to B",
            targets=[Target("ratio", "<=", round(1 / 1.8, 3), ">= 1.8x faster")],
            samples={"corral_s": rounded(ref_s), "baseline_s": rounded(ctl_s)},
            extra={"nbytes": nbytes},
        ),
        Row(
            key="data.a_to_b.controller_bytes",
            backend=NAME,
            label="bytes the controller received on the by-ref path, % of the payload",
            unit="%",
            value=share,
            baseline=100.0,
            baseline_label="through the controller: the whole payload",
            targets=[Target("abs", "<=", 1.0, "<= 1 %")],
            samples={"bytes": [float(x) for x in read]},
        ),
    ]


def bench_broadcast(sched, owner: str, readers: list[str], reps: int) -> list[Row]:
    """Each reader's method gets the whole array. ``describe`` reads two elements (the
    transfer: the value is in the reader's hands, its pages come in on first use);
    ``touch`` reads every page (the transfer plus the readers' own page-ins, which on a
    2-core machine serialise across 8 readers)."""
    nbytes = 256 * MiB
    rows = []
    for method, suffix, targets in (
        ("describe", "", [Target("ratio", "<=", 2.0, "<= 2x one transfer")]),
        ("touch", ".every_page", []),
    ):
        all_s, one_s = [], []
        for i in range(reps + 1):
            all_s.append(_broadcast_once(sched, owner, readers, method, nbytes))
            one_s.append(_broadcast_once(sched, owner, readers[:1], method, nbytes))
            if i == 0:  # warm-up
                all_s.clear()
                one_s.clear()
        log(
            f"broadcast 256 MiB ({method}): x{len(readers)} {median(all_s) * 1e3:.1f} ms, "
            f"x1 {median(one_s) * 1e3:.1f} ms"
        )
        what = "reads every page" if method == "touch" else "gets the array"
        rows.append(
            Row(
                key=f"data.broadcast.256MiB_x{len(readers)}{suffix}",
                backend=NAME,
                label=f"one 256 MiB ref to {len(readers)} workers at once (each {what})",
                unit="s",
                value=median(all_s),
                baseline=median(one_s),
                baseline_label="the same to one worker",
                targets=targets,
                samples={"corral_s": rounded(all_s), "baseline_s": rounded(one_s)},
                extra={"nbytes": nbytes, "readers": len(readers), "method": method},
            )
        )
    return rows


def _broadcast_once(sched, owner: str, who: list[str], method: str, nbytes: int) -> float:
    """A fresh ref (nothing cached), read by every worker of ``who`` at once."""
    ref = sched.call_engine(owner, "array", None, nbytes, rpc_meta={"keep": True})

    async def read_all() -> list:
        return await asyncio.gather(*(sched.async_call_engine(w, method, None, ref) for w in who))

    started = time.perf_counter()
    got = asyncio.run(read_all())
    took = time.perf_counter() - started
    assert all(g == got[0] for g in got)
    ref.free()
    return took


def _base_tree(ctx: Context) -> str | None:
    """``src`` of BASE_COMMIT, extracted into the run's scratch folder."""
    target = tempfile.mkdtemp(prefix="base-", dir=ctx.fileroot)
    try:
        archive = subprocess.run(
            ["git", "-C", ctx.repo, "archive", BASE_COMMIT, "src"],
            check=True,
            capture_output=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", target], input=archive, check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        log(f"cannot extract {BASE_COMMIT}: {exc}; skipping the noop comparison")
        return None
    return os.path.join(target, "src")


def bench_noop_vs_base(ctx: Context, blocks: int, calls: int) -> list[Row]:
    """Noop p50 in child processes, alternating: this tree, this tree with shared memory
    off (``CORRAL_SHM=0``: the data plane's cost on the small-call path), and the tree before
    the data plane (which also lacks everything landed since, e.g. request signing)."""
    base = _base_tree(ctx)
    here = os.path.join(ctx.repo, "src")
    probe = os.path.join(HERE, "noop_probe.py")
    variants = {"here": (here, "1"), "off": (here, "0")}
    if base is not None:
        variants["base"] = (base, "1")
    p50: dict[str, list[float]] = {name: [] for name in variants}
    for block in range(blocks):
        names = list(variants) if block % 2 == 0 else list(reversed(variants))
        for name in names:
            path, shm_on = variants[name]
            env = {**os.environ, "PYTHONPATH": path, "CORRAL_SHM": shm_on}
            out = subprocess.run(
                [sys.executable, probe, ctx.fileroot, str(calls)],
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
                check=True,
            ).stdout
            p50[name].append(float(out.strip().splitlines()[-1]))
    log("noop p50: " + ", ".join(f"{k} {median(v):.3f} ms" for k, v in p50.items()))
    rows = [
        Row(
            key="data.noop.p50.shm_cost",
            backend=NAME,
            label="noop call_engine p50, shared memory on vs off (same tree)",
            unit="ms",
            value=median(p50["here"]),
            baseline=median(p50["off"]),
            baseline_label="CORRAL_SHM=0, alternating processes",
            targets=[Target("ratio", "<=", 1.1, "<= 1.1x")],
            samples={"corral_ms": rounded(p50["here"]), "baseline_ms": rounded(p50["off"])},
        )
    ]
    if "base" in p50:
        rows.append(
            Row(
                key="data.noop.p50.vs_base",
                backend=NAME,
                label="noop call_engine p50, this tree vs the commit before the data plane",
                unit="ms",
                value=median(p50["here"]),
                baseline=median(p50["base"]),
                baseline_label=f"commit {BASE_COMMIT} (also before request signing etc.)",
                samples={"corral_ms": rounded(p50["here"]), "baseline_ms": rounded(p50["base"])},
            )
        )
    return rows


def run(ctx: Context) -> list[Row]:
    reps = 3 if ctx.quick else 7
    sched = _scheduler(ctx)
    a, b = _workers(sched, "a", 1) + _workers(sched, "b", 1)
    rows = bench_shm(sched, a, reps)
    rows += bench_a_to_b(sched, a, b, reps)
    readers = _workers(sched, "readers", 2 if ctx.quick else 8)
    rows += bench_broadcast(sched, a, readers, reps)
    sched.delete_workers("readers")
    rows += bench_relay(sched, 2 if ctx.quick else 4, reps)
    sched.close()
    rows += bench_noop_vs_base(ctx, 2 if ctx.quick else 6, 300 if ctx.quick else 1500)
    return rows
