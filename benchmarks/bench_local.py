"""corral on the local backend, each figure next to the machine's own limit (issue #2).

Rows (keys):

* ``local.worker_start.n{1,8,32}`` a worker's own start: N ``python -m corral.worker``
  until each registered vs N bare ``python -c pass`` (``worker_start.py``)
* ``local.cold_start.n{1,8,32}``  create_workers of N replicas until all are ready
  vs N bare ``python -c pass`` started in parallel
* ``local.noop.p50`` / ``.p99``   call_engine(EchoEngine.noop) vs a raw-socket ping-pong
  of the same request/reply sizes, both with client and server pinned to two CPUs
  (``.p50.one_cpu``: both on one CPU)
* ``local.fanout.rate``           async_call_engine x N with asyncio.gather over 8 workers
  vs an asyncio client with one raw connection to each of 8 echo servers
* ``local.payload.<kind>``        call_engine(echo, array) round trip in GB/s (bytes sent +
  received) vs a raw-socket round trip of the same bytes; ``.memcpy`` rows compare
  with one in-process copy per direction
* ``local.wire.bf16_16MiB``       the wire frame of a bf16 tensor vs its nbytes
* ``local.delete.n8`` / ``local.delete.n8.left``  delete_workers of 8 workers (each with an
  engine) and the processes left, vs SIGTERM + reap of 8 idle Python processes
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import baselines
import numpy as np
import placement
import stats_overhead
import view_overhead
import worker_start
from common import (
    BackendUnavailable,
    Context,
    Row,
    Target,
    log,
    median,
    percentile,
    rounded,
    time_forks,
)

NAME = "local"
MiB = 1 << 20
ENGINE = "corral.testing.engines.EchoEngine"

# Targets from the issue; peer figures from /work/shared/recipes/README.md.
PEERS = {
    "cold_start.n1": (8.0, "~8 s until one worker is ready"),
    "noop.p50": (4.4, "4.4 ms"),
    "noop.p99": (16.7, "16.7 ms"),
    "fanout.rate": (500.0, "~500 calls/s"),
    "payload.f32_16MiB": (0.058, "58 MB/s (base64 in JSON)"),
    "payload.bf16_16MiB": (0.023, "23 MB/s (bf16 sent as fp32)"),
    "delete.n8": (4.0, "~4 s (2 workers)"),
}


def check() -> str | None:
    try:
        import corral.backends.local  # noqa: F401
    except Exception as exc:  # pragma: no cover - the local backend is part of the core
        return f"corral.backends.local cannot be imported: {type(exc).__name__}: {exc}"
    return None


class Plan:
    """Iteration counts: full by default, a few of each with --quick (< 60 s)."""

    def __init__(self, quick: bool):
        self.cold_sizes = [1, 8] if quick else [1, 8, 32]
        self.cold_reps = 1 if quick else 3
        self.start_reps = 1 if quick else 5
        self.noop_warmup = 100 if quick else 300
        self.noop_calls = 300 if quick else 2000
        self.noop_blocks = 3 if quick else 10
        self.fanout_calls = 800 if quick else 4000
        self.fanout_reps = 1 if quick else 5
        self.payload_reps = (
            {1: 5, 16: 3, 128: 2} if quick else {1: 30, 16: 10, 128: 5}
        )  # MiB -> repetitions
        self.workers = 8
        self.fork_reps = 2 if quick else 5


def _peer(row: Row, name: str) -> Row:
    if name in PEERS:
        value, text = PEERS[name]
        row.extra["peer"] = {"value": value, "text": text}
    return row


def _scheduler(ctx: Context):
    from corral.backends.local import LocalScheduler
    from corral.config import BaseExperimentConfig

    cfg = BaseExperimentConfig(experiment_name=ctx.unique_name("bench"), trial_name="t0")
    sched = LocalScheduler(
        exp_config=cfg,
        gpu_devices=[],
        fileroot=ctx.fileroot,
        startup_timeout=120.0,
        progress=lambda text: None,
    )
    ctx.on_close(sched.close)
    return sched


def _job(role: str, replicas: int):
    from corral import Job, SchedulingSpec

    return Job(role=role, replicas=replicas, tasks=[SchedulingSpec(cpu=1, gpu=0)])


def _worker_pids(sched, role: str) -> list[int]:
    pids = {w.pid for w in sched.get_workers(role) if w.pid}
    pids.update(sched.launcher.pids(role))
    return sorted(pids)


async def _create_engines(sched, ids: list[str]) -> None:
    await asyncio.gather(*(sched.create_engine(i, ENGINE) for i in ids))


def _timed_delete(sched, role: str) -> tuple[float, dict]:
    from common import processes_left

    pids = _worker_pids(sched, role)
    started = time.perf_counter()
    sched.delete_workers(role)
    elapsed = time.perf_counter() - started
    return elapsed, processes_left(pids)


# ------------------------------------------------------------------ 1 + 5: start, delete
def bench_cold_start(ctx: Context, sched, plan: Plan) -> tuple[list[Row], dict]:
    corral: dict[int, list[float]] = {n: [] for n in plan.cold_sizes}
    bare: dict[int, list[float]] = {n: [] for n in plan.cold_sizes}
    floor: dict[int, list[float]] = {n: [] for n in plan.cold_sizes}
    deletes: dict[str, list] = {"corral": [], "bare": [], "left": [], "bare_left": []}
    for rep in range(plan.cold_reps):
        for n in plan.cold_sizes:
            bare[n].append(baselines.bare_start(n))
            role = f"cold{n}-r{rep}"
            started = time.perf_counter()
            ids = sched.create_workers(_job(role, n))
            corral[n].append(time.perf_counter() - started)
            floor[n].append(baselines.import_floor(n))
            if n == plan.workers:
                asyncio.run(_create_engines(sched, ids))
                seconds, left = _timed_delete(sched, role)
                deletes["corral"].append(seconds)
                deletes["left"].append(left)
                bare_seconds, bare_left = baselines.bare_stop(n)
                deletes["bare"].append(bare_seconds)
                deletes["bare_left"].append(bare_left)
            else:
                sched.delete_workers(role)
            log(
                f"cold start n={n} rep {rep}: corral {corral[n][-1]:.3f}s, "
                f"bare python {bare[n][-1]:.3f}s, import floor {floor[n][-1]:.3f}s"
            )
    rows = []
    for n in plan.cold_sizes:
        targets = []
        if n == 8:
            targets = [
                Target("abs", "<=", 1.5, "<= 1.5 s"),
                Target("ratio", "<=", 3.0, "<= 3x bare"),
            ]
        row = Row(
            key=f"local.cold_start.n{n}",
            backend=NAME,
            label=f"cold start, {n} worker(s) ready",
            unit="s",
            value=median(corral[n]),
            baseline=median(bare[n]),
            baseline_label=f"{n} x `python -c pass` in parallel",
            targets=targets,
            samples={"corral": rounded(corral[n]), "baseline": rounded(bare[n])},
            extra={
                "import_floor_s": rounded(floor[n]),
                "import_floor_note": f"{n} x `python -c 'import corral.worker.runtime; "
                "os._exit(0)'` in parallel, measured right after the workers started: what a "
                "worker imports before it can serve (noisy; a diagnostic, not a baseline)",
            },
        )
        rows.append(_peer(row, f"cold_start.n{n}"))
    return rows, deletes


def delete_rows(deletes: dict, main_delete: tuple[float, dict] | None, n: int) -> list[Row]:
    extra: dict[str, Any] = {"leftover_detail": deletes["left"]}
    if main_delete is not None:
        extra["main_role_delete_s"] = round(main_delete[0], 6)
        extra["main_role_left"] = main_delete[1]
        extra["main_role_note"] = (
            "the benchmark's main role, deleted after the fan-out left many pooled connections"
        )
    time_row = Row(
        key=f"local.delete.n{n}",
        backend=NAME,
        label=f"delete_workers, {n} workers with an engine each",
        unit="s",
        value=median(deletes["corral"]),
        baseline=median(deletes["bare"]),
        baseline_label=f"SIGTERM + reap {n} idle python processes",
        targets=[Target("abs", "<=", 0.5, "<= 0.5 s")],
        samples={"corral": rounded(deletes["corral"]), "baseline": rounded(deletes["bare"])},
        extra=extra,
    )
    lefts = [d["left"] for d in deletes["left"]]
    if main_delete is not None:
        lefts.append(main_delete[1]["left"])
    left_row = Row(
        key=f"local.delete.n{n}.left",
        backend=NAME,
        label=f"processes left after delete_workers of {n}",
        unit="processes",
        value=float(max(lefts)),
        baseline=float(max(deletes["bare_left"])),
        baseline_label="processes left after SIGTERM + reap",
        targets=[Target("abs", "==", 0.0, "0 left")],
        samples={"corral": [float(x) for x in lefts], "baseline": deletes["bare_left"]},
    )
    return [_peer(time_row, f"delete.n{n}"), left_row]


# ------------------------------------------------------------------ fork
def bench_fork(sched, plan: Plan) -> list[Row]:
    bare = [baselines.bare_start(1) for _ in range(plan.fork_reps)]
    forks = time_forks(sched, plan.fork_reps)
    log(
        f"fork: one worker forked next to a worker {median(forks):.3f}s; bare python {median(bare):.3f}s"
    )
    return [
        Row(
            key="local.fork.n1",
            backend=NAME,
            label="fork_workers, one forked worker ready next to its target",
            unit="s",
            value=median(forks),
            baseline=median(bare),
            baseline_label="1 x `python -c pass`",
            targets=[Target("ratio", "<=", 3.0, "<= 3x bare")],  # as a worker's own start
            samples={"corral": rounded(forks), "baseline": rounded(bare)},
        )
    ]


# ------------------------------------------------------------------ 2: noop latency
def measured_noop_sizes(sched, wid: str) -> tuple[int, int]:
    """Bytes of one real noop request and reply as the blocking client sends and reads
    them (a text head and its frame, or a binary frame once the connection has switched
    to frames: ``rpc.frames``), seen on the client side after a few calls.

    Raises if the client's internals have moved so that no call was seen: the baseline
    must exchange the bytes corral exchanges, not a guess.
    """
    from corral.rpc import client, frames, http, wire

    seen: dict[str, int] = {}
    send, interpret = client.send_message, client.interpret_reply
    request_frame, reply_fields = frames.request_frame, frames.reply_fields

    def spy_send(sock, start_line, headers, parts):
        size = wire.frame_size(parts)
        seen["request"] = len(http.render_head(start_line, headers, size)) + size
        return send(sock, start_line, headers, parts)

    def spy_request_frame(*args):
        data, nonce = request_frame(*args)
        seen["request"] = len(data)
        return data, nonce

    def spy_reply_fields(keys, address, frame, nonce):
        seen["reply"] = len(frame)
        return reply_fields(keys, address, frame, nonce)

    def spy_interpret(address, msg):
        headers = {k: v for k, v in msg.headers.items() if k != "content-length"}
        body = len(msg.body)
        seen["reply"] = len(http.render_head(msg.start_line, headers, body)) + body
        return interpret(address, msg)

    client.send_message, client.interpret_reply = spy_send, spy_interpret
    frames.request_frame, frames.reply_fields = spy_request_frame, spy_reply_fields
    try:
        for _ in range(3):  # a connection's first replies are text heads, then frames
            seen.clear()
            sched.call_engine(wid, "noop")
    finally:
        client.send_message, client.interpret_reply = send, interpret
        frames.request_frame, frames.reply_fields = request_frame, reply_fields
    if "request" not in seen or "reply" not in seen:
        raise RuntimeError(
            f"measured_noop_sizes saw {sorted(seen) or 'nothing'} of a noop call: the "
            "blocking client no longer sends or reads through the functions it spies on "
            "(benchmarks/bench_local.py); update it"
        )
    return seen["request"], seen["reply"]


def bench_noop(sched, wid: str, server: baselines.EchoServer, plan: Plan) -> list[Row]:
    """Raw ping-pong and corral calls in alternating blocks, each block once with the
    client and the server on two CPUs (the rows with targets: a controller and its
    worker do not share a CPU) and once on one CPU (``.one_cpu``, for scale); see
    ``placement`` for why the two are pinned alike."""
    request_bytes, reply_bytes = measured_noop_sizes(sched, wid)
    for _ in range(plan.noop_warmup):
        sched.call_engine(wid, "noop")
    role = wid.rsplit("/", 1)[0]
    servers = [server.proc.pid, *(w.pid for w in sched.get_workers(role) if w.id == wid)]
    lat: dict[str, list[float]] = {p: [] for p in placement.PLACEMENTS}
    raw: dict[str, list[float]] = {p: [] for p in placement.PLACEMENTS}
    pinned = placement.cpus_for("two_cpus") is not None
    per_block = plan.noop_calls // plan.noop_blocks
    for _ in range(plan.noop_blocks):
        for where in placement.PLACEMENTS:
            with placement.placed(where, servers):
                raw[where] += baselines.pingpong(
                    server.port, request_bytes, reply_bytes, 20, per_block
                )
                for _ in range(20):
                    sched.call_engine(wid, "noop")
                for _ in range(per_block):
                    started = time.perf_counter()
                    sched.call_engine(wid, "noop")
                    lat[where].append(time.perf_counter() - started)
    extra = {
        "calls": plan.noop_calls,
        "request_bytes": request_bytes,
        "reply_bytes": reply_bytes,
        "blocks": plan.noop_blocks,
        "baseline_note": "raw ping-pong and corral calls in alternating blocks, both pinned "
        "alike (client and server on two CPUs; .one_cpu: on one)"
        if pinned
        else "raw ping-pong and corral calls in alternating blocks (fewer than 2 CPUs: not pinned)",
    }
    rows = []
    for where, q, suffix, targets in (
        (
            "two_cpus",
            50,
            "p50",
            [Target("abs", "<=", 0.3, "<= 0.3 ms"), Target("ratio", "<=", 2.0, "<= 2x raw")],
        ),
        ("two_cpus", 99, "p99", []),
        ("one_cpu", 50, "p50.one_cpu", []),
    ):
        ms = [x * 1e3 for x in lat[where]]
        raw_ms = [x * 1e3 for x in raw[where]]
        log(
            f"noop ({where}): p{q} {percentile(ms, q):.3f} ms; "
            f"raw ping-pong p{q} {percentile(raw_ms, q):.4f} ms"
        )
        on = "client and worker on one CPU" if where == "one_cpu" else "on two CPUs"
        row = Row(
            key=f"local.noop.{suffix}",
            backend=NAME,
            label=f"noop call_engine p{q}" + (f" ({on})" if pinned else ""),
            unit="ms",
            value=percentile(ms, q),
            baseline=percentile(raw_ms, q),
            baseline_label=f"raw TCP ping-pong p{q} ({request_bytes} B / {reply_bytes} B)",
            targets=targets,
            samples={"corral": rounded(ms, 4), "baseline": rounded(raw_ms, 4)} if q == 50 else {},
            extra=dict(extra),
        )
        rows.append(_peer(row, f"noop.p{q}") if where == "two_cpus" else row)
    return rows


# ------------------------------------------------------------------ 3: async fan-out
def bench_fanout(sched, ids: list[str], ports: list[int], plan: Plan) -> list[Row]:
    request_bytes, reply_bytes = measured_noop_sizes(sched, ids[0])
    n = plan.fanout_calls

    async def gather_once() -> float:
        started = time.perf_counter()
        await asyncio.gather(
            *(sched.async_call_engine(ids[i % len(ids)], "noop") for i in range(n))
        )
        return time.perf_counter() - started

    async def main() -> tuple[float, list[float], list[float]]:
        """The first gather opens the connections; then raw and corral alternate on the
        same event loop, ``fanout_reps`` of each (the row: the median of each)."""
        first = await gather_once()
        raw, seconds = [], []
        for _ in range(plan.fanout_reps):
            raw.append(await baselines.parallel_rate_async(ports, request_bytes, reply_bytes, n))
            seconds.append(await gather_once())
        return first, seconds, raw

    first, seconds, raw_rates = asyncio.run(main())
    rates = [n / s for s in seconds]
    sequential = baselines.pingpong(ports[0], request_bytes, reply_bytes, 50, 500)
    log(
        f"fan-out: {median(rates):.0f} calls/s (first gather {n / first:.0f}/s); "
        f"raw parallel {median(raw_rates):.0f}/s"
    )
    row = Row(
        key="local.fanout.rate",
        backend=NAME,
        label=f"async fan-out over {len(ids)} workers ({n} calls, one gather; median of "
        f"{plan.fanout_reps}, alternating with the baseline)",
        unit="calls/s",
        value=median(rates),
        baseline=median(raw_rates),
        baseline_label=f"asyncio, 1 raw connection to each of {len(ports)} echo servers",
        higher_is_better=True,
        targets=[Target("ratio", "<=", 1.5, "<= 1.5x raw asyncio")],
        samples={"corral": rounded(rates, 1), "baseline": rounded(raw_rates, 1)},
        extra={
            "first_gather_calls_per_s": round(n / first, 1),
            "first_gather_note": "the first gather opens the connections (up to 8 per worker)",
            "raw_sequential_calls_per_s": round(1 / median(sequential), 1),
        },
    )
    return [_peer(row, "fanout.rate")]


# ------------------------------------------------------------------ 4: payloads
def _payload_rows(
    kind: str,
    label: str,
    nbytes: int,
    corral_s: list[float],
    raw_s: list[float],
    copy_s: list[float],
    targets: list[Target],
    extra: dict,
) -> list[Row]:
    def gbps(seconds: list[float]) -> list[float]:
        return [2 * nbytes / s / 1e9 for s in seconds]

    corral_rate, raw_rate = gbps(corral_s), gbps(raw_s)
    # A memcpy round trip is one copy each way: 2 * nbytes moved in 2 * t_copy.
    copy_rate = [nbytes / s / 1e9 for s in copy_s]
    main = Row(
        key=f"local.payload.{kind}",
        backend=NAME,
        label=f"round trip {label}",
        unit="GB/s",
        value=median(corral_rate),
        baseline=median(raw_rate),
        baseline_label="raw TCP round trip, same bytes",
        higher_is_better=True,
        targets=targets,
        samples={"corral_s": rounded(corral_s), "baseline_s": rounded(raw_s)},
        extra={"nbytes": nbytes, "rate_counts": "bytes sent + bytes received", **extra},
    )
    copy = Row(
        key=f"local.payload.{kind}.memcpy",
        backend=NAME,
        label=f"round trip {label} vs memcpy",
        unit="GB/s",
        value=median(corral_rate),
        baseline=median(copy_rate),
        baseline_label="in-process numpy copy, one per direction",
        higher_is_better=True,
        samples={"baseline_copy_s": rounded(copy_s)},
        extra={"nbytes": nbytes},
    )
    return [_peer(main, f"payload.{kind}"), copy]


def _measure_payload(
    sched, wid: str, raw: baselines.RawClient, value: Any, nbytes: int, reps: int, same
) -> tuple[list[float], list[float], bool]:
    back = sched.call_engine(wid, "echo", None, value)  # warm-up, and the correctness check
    verified = bool(same(value, back))
    del back
    raw.roundtrip(nbytes)
    corral_s, raw_s = [], []
    for _ in range(reps):  # interleaved, so both see the same background noise
        started = time.perf_counter()
        back = sched.call_engine(wid, "echo", None, value)
        corral_s.append(time.perf_counter() - started)
        del back
        raw_s.append(raw.roundtrip(nbytes))
    return corral_s, raw_s, verified


def bench_payloads(sched, wid: str, port: int, plan: Plan) -> list[Row]:
    sizes = sorted(plan.payload_reps)
    raw = baselines.RawClient(port, max(sizes) * MiB)
    rows: list[Row] = []
    try:
        for mib in sizes:
            reps = plan.payload_reps[mib]
            nbytes = mib * MiB
            array = np.arange(nbytes // 4, dtype=np.float32)
            corral_s, raw_s, verified = _measure_payload(
                sched, wid, raw, array, nbytes, reps, np.array_equal
            )
            copy_s = baselines.memcpy(nbytes, max(reps, 5))
            targets = []
            if mib == 128:
                targets = [
                    Target("abs", ">=", 1.0, ">= 1 GB/s"),
                    Target("ratio", "<=", 2.0, "<= 2x raw"),
                ]
            rows += _payload_rows(
                f"f32_{mib}MiB",
                f"{mib} MiB float32 numpy",
                nbytes,
                corral_s,
                raw_s,
                copy_s,
                targets,
                {"verified_equal": verified},
            )
            log(
                f"payload {mib} MiB f32: corral {2 * nbytes / median(corral_s) / 1e9:.2f} GB/s, "
                f"raw {2 * nbytes / median(raw_s) / 1e9:.2f} GB/s"
            )
            del array
        rows += bench_bf16(sched, wid, raw, plan)
    finally:
        raw.close()
    return rows


def bench_bf16(sched, wid: str, raw: baselines.RawClient, plan: Plan) -> list[Row]:
    try:
        import torch
    except ImportError:
        log("torch is not installed: skipping the bf16 rows")
        return []
    from corral.rpc import wire

    nbytes = 16 * MiB
    tensor = torch.randn(nbytes // 2, dtype=torch.float32).to(torch.bfloat16)
    assert tensor.nbytes == nbytes
    parts = wire.encode(tensor)
    frame = wire.frame_size(parts)
    call_frame = wire.frame_size(
        wire.encode({"engine_name": None, "method": "echo", "args": [tensor], "kwargs": {}})
    )

    def same(a, b) -> bool:
        return isinstance(b, torch.Tensor) and b.dtype == torch.bfloat16 and torch.equal(a, b)

    reps = plan.payload_reps[16]
    corral_s, raw_s, verified = _measure_payload(sched, wid, raw, tensor, nbytes, reps, same)
    copy_s = baselines.memcpy(nbytes, max(reps, 5))
    log(
        f"payload 16 MiB bf16: corral {2 * nbytes / median(corral_s) / 1e9:.2f} GB/s, "
        f"frame {frame} B for {nbytes} B of tensor"
    )
    rows = _payload_rows(
        "bf16_16MiB",
        "16 MiB bfloat16 torch",
        nbytes,
        corral_s,
        raw_s,
        copy_s,
        [],
        {"verified_equal_and_bf16": verified},
    )
    rows.append(
        Row(
            key="local.wire.bf16_16MiB",
            backend=NAME,
            label="wire frame of a 16 MiB bf16 tensor",
            unit="bytes",
            value=float(frame),
            baseline=float(nbytes),
            baseline_label="tensor.nbytes",
            targets=[Target("ratio", "<=", 1.001, "frame ~= nbytes")],
            extra={
                "frame_bytes": frame,
                "tensor_nbytes": nbytes,
                "overhead_bytes": frame - nbytes,
                "call_request_frame_bytes": call_frame,
                "as_fp32_would_be_bytes": 2 * nbytes,
            },
        )
    )
    return rows


# ------------------------------------------------------------------ the whole backend
def run(ctx: Context) -> list[Row]:
    reason = check()
    if reason:
        raise BackendUnavailable(reason)
    plan = Plan(ctx.quick)
    sched = _scheduler(ctx)
    servers = []

    def stop_servers() -> None:
        for server in servers:
            server.stop()

    ctx.on_close(stop_servers)
    for _ in range(plan.workers):
        servers.append(baselines.EchoServer())
    ports = [s.port for s in servers]

    rows = worker_start.rows(ctx.fileroot, plan.cold_sizes, plan.start_reps)
    cold, deletes = bench_cold_start(ctx, sched, plan)
    rows += cold
    rows += bench_fork(sched, plan)
    role = "main"
    log(f"starting {plan.workers} workers with an {ENGINE.rsplit('.', 1)[1]} each")
    ids = sched.create_workers(_job(role, plan.workers))
    asyncio.run(_create_engines(sched, ids))
    rows += bench_noop(sched, ids[0], servers[0], plan)
    rows += stats_overhead.bench(sched, ids, ctx.quick)
    rows += view_overhead.bench(sched, ids, ctx.quick)
    rows += bench_fanout(sched, ids, ports, plan)
    rows += bench_payloads(sched, ids[1], ports[1], plan)
    main_delete = _timed_delete(sched, role)
    rows += delete_rows(deletes, main_delete, plan.workers)
    return rows
