"""The two RL verbs (issue 23): dispatch of a batch over a role, and weight sync.

    python benchmarks/run.py --backends verbs      # or: python benchmarks/bench_verbs.py

Local workers on this host (same-host transfers use shared memory; the relay's readers run
with ``CORRAL_SHM=0``, the stand-in for other hosts used by the relay tests). Sizes:
``CORRAL_BENCH_VERBS_MB`` (default 512; ``--quick``: 64); ``CORRAL_BENCH_VERBS_PARTS``
(default ``dispatch,weights``) picks the parts. Same run, alternating.

Rows (keys ``verbs.*``):

* ``verbs.dispatch.<S>MiB_x8.by_ref``            a batch held by a worker, dispatched by ref
  over 8 workers (each fetches its rows from the owner) vs through the controller (the
  controller fetches the batch, then dispatches the array)
* ``verbs.dispatch.<S>MiB_x8.vs_memcpy``         the same by-ref dispatch vs one in-process
  memcpy of the batch (the bound: every byte has to be copied once)
* ``verbs.dispatch.<S>MiB_x8.controller_bytes``  bytes the controller received on the
  by-ref path, % of the batch; target < 1 %
* ``verbs.weights.<S>MB_x<N>.<way>``             a <S> MB fp32 state dict from the trainer
  to N = 4 and 8 rollout workers, each way vs through the controller: ``group`` (a gloo
  group, ``broadcast_state_dict``), ``ref`` (a ref fetched by each: one shared-memory
  segment on one host), ``relay`` (a ref read by readers on stand-in hosts: the chain)
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from common import Context, Row, Target, log, machine_info, median, rounded  # noqa: E402

NAME = "verbs"
MiB = 1 << 20
SHARD = "corral.testing.verb_engines.ShardEngine"
WEIGHTS = "corral.testing.verb_engines.WeightEngine"


def check() -> str | None:
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        return f"torch is needed for the weight-sync rows: {exc}"
    return None


def _scheduler(ctx: Context):
    from corral.backends.local import LocalScheduler
    from corral.config import BaseExperimentConfig

    cfg = BaseExperimentConfig(experiment_name=ctx.unique_name("verbs"), trial_name="t0")
    sched = LocalScheduler(
        exp_config=cfg, gpu_devices=[], fileroot=ctx.fileroot, startup_timeout=180.0,
        progress=lambda t: None,
    )  # fmt: skip
    ctx.on_close(sched.close)
    return sched


def _role(sched, role: str, n: int, engine: str, env: dict | None = None) -> list[str]:
    from corral import Job, SchedulingSpec

    spec = SchedulingSpec(cpu=1, env_vars=dict(env or {}))
    ids = sched.create_workers(Job(role=role, replicas=n, tasks=[spec]))
    for wid in ids:
        asyncio.run(sched.create_engine(wid, engine, None, wid))
    return ids


def _timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def _gather(sched, calls: list) -> list:
    async def run():
        return await asyncio.gather(*(sched.async_call_engine(w, m, None, *a) for w, m, a in calls))

    return asyncio.run(run())


def bench_dispatch(sched, nbytes: int, reps: int) -> list[Row]:
    (owner,) = _role(sched, "batch", 1, SHARD)
    _role(sched, "dp", 8, WEIGHTS)
    rows, cols = nbytes // 4 // 1024, 1024

    def received():
        return (
            sched.parts.caller.client.bytes_received
            + sched.parts.caller.async_client.bytes_received
        )  # noqa: E731

    # the batch is made once and held by its owner; what is timed is moving it
    batch = sched.call_engine(owner, "batch", None, rows, cols, rpc_meta={"keep": True})

    def by_ref() -> None:
        got = sched.dispatch("dp", "touch", None, batch, collect="list")
        assert sum(got) == nbytes, got

    def through_controller() -> None:
        value = batch.to_local()  # the controller fetches it, then dispatches the array
        got = sched.dispatch("dp", "touch", None, value, collect="list")
        assert sum(got) == nbytes, got

    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    by_ref(), through_controller()  # warm: connections, segments, pages
    ref_s, ctl_s, copy_s, read = [], [], [], []
    for i in range(reps):
        before = received()
        ref_s.append(_timed(by_ref))
        read.append(received() - before)
        ctl_s.append(_timed(through_controller))
        copy_s.append(_timed(lambda: np.copyto(dst, src)))
        gc.collect()
        log(f"dispatch rep {i}: by ref {ref_s[-1]:.2f} s, controller {ctl_s[-1]:.2f} s")
    batch.free()
    sched.delete_workers("dp"), sched.delete_workers("batch")
    size = f"{nbytes // MiB}MiB_x8"
    samples = {
        "by_ref_s": rounded(ref_s),
        "controller_s": rounded(ctl_s),
        "memcpy_s": rounded(copy_s),
    }
    return [
        Row(
            key=f"verbs.dispatch.{size}.by_ref", backend=NAME,
            label=f"dispatch {nbytes // MiB} MiB held by a worker over 8 workers, by ref",
            unit="s", value=median(ref_s), baseline=median(ctl_s),
            baseline_label="through the controller (it fetches the batch, then dispatches it)",
            samples=samples, extra={"nbytes": nbytes},
        ),
        Row(
            key=f"verbs.dispatch.{size}.vs_memcpy", backend=NAME,
            label="the same by-ref dispatch vs one memcpy of the batch (the bound)",
            unit="s", value=median(ref_s), baseline=median(copy_s),
            baseline_label="one in-process numpy copy of the batch", samples=samples,
        ),
        Row(
            key=f"verbs.dispatch.{size}.controller_bytes", backend=NAME,
            label="bytes the controller received on the by-ref dispatch, % of the batch",
            unit="%", value=100.0 * max(read) / nbytes, baseline=100.0,
            baseline_label="through the controller: the whole batch",
            targets=[Target("abs", "<=", 1.0, "<= 1 %")],
            samples={"bytes": [float(x) for x in read]},
        ),
    ]  # fmt: skip


def bench_weights(sched, mbytes: int, reps: int) -> list[Row]:
    (trainer,) = _role(sched, "trainer", 1, WEIGHTS)
    local = _role(sched, "rollout", 8, WEIGHTS)
    remote = _role(sched, "standin", 8, WEIGHTS, {"CORRAL_SHM": "0"})
    sched.call_engine(trainer, "make", None, mbytes, 0, 16)
    nbytes = sched.call_engine(trainer, "state_nbytes")
    rows: list[Row] = []
    for n in (4, 8):
        rows += _weights_to(sched, trainer, local[:n], remote[:n], nbytes, mbytes, reps)
    return rows


def _weights_to(sched, trainer, readers, standins, nbytes, mbytes, reps) -> list[Row]:
    n, group = len(readers), f"w{len(readers)}"
    sched.create_process_group(group, [trainer, *readers], timeout=300)

    def by_group() -> None:
        calls = [(trainer, "send", (group,))] + [(w, "receive", (group,)) for w in readers]
        assert _gather(sched, calls) == [nbytes] * (n + 1)

    def by_ref(who: list[str]) -> None:
        ref = sched.call_engine(trainer, "state_array", None, rpc_meta={"keep": True})
        assert _gather(sched, [(w, "touch", (ref,)) for w in who]) == [nbytes] * n
        ref.free()

    def through_controller() -> None:
        value = sched.call_engine(trainer, "state_array", None)
        assert _gather(sched, [(w, "touch", (value,)) for w in readers]) == [nbytes] * n

    ways = {
        "group": by_group,
        "ref": lambda: by_ref(readers),
        "relay": lambda: by_ref(standins),
        "controller": through_controller,
    }
    times: dict[str, list[float]] = {k: [] for k in ways}
    for i in range(reps + 1):
        for name in ways if i % 2 else reversed(list(ways)):
            took = _timed(ways[name])
            gc.collect()
            if i:  # the first round warms connections, pages, relay memory
                times[name].append(took)
        done = ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items() if v)
        log(f"weights x{n} rep {i}: {done}")
    sched.destroy_process_group(group)
    ctl = median(times["controller"])
    samples = {f"{k}_s": rounded(v) for k, v in times.items()}
    rows = []
    for way, label in (
        ("group", "a gloo group across roles (broadcast_state_dict)"),
        ("ref", "a ref fetched by each reader (same host: one shared segment)"),
        ("relay", "a ref read by readers on stand-in hosts (CORRAL_SHM=0): the relay chain"),
    ):
        rows.append(
            Row(
                key=f"verbs.weights.{mbytes}MB_x{n}.{way}",
                backend=NAME,
                label=f"{mbytes} MB state dict, trainer -> {n} rollout workers: {label}",
                unit="s",
                value=median(times[way]),
                baseline=ctl,
                baseline_label="through the controller (fetch, then send to each)",
                samples=samples,
                extra={"nbytes": nbytes, "readers": n},
            )  # fmt: skip
        )
    return rows


def run(ctx: Context) -> list[Row]:
    mbytes = 64 if ctx.quick else int(os.environ.get("CORRAL_BENCH_VERBS_MB", "512"))
    reps = 1 if ctx.quick else 3
    parts = os.environ.get("CORRAL_BENCH_VERBS_PARTS", "dispatch,weights").split(",")
    sched = _scheduler(ctx)
    rows = bench_dispatch(sched, mbytes * MiB, reps) if "dispatch" in parts else []
    rows += bench_weights(sched, mbytes, reps) if "weights" in parts else []
    sched.close()
    return rows


def main() -> int:
    import report

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)
    quick = "--quick" in sys.argv
    ctx = Context(quick=quick, repo=os.path.dirname(HERE))
    doc = {"machine": machine_info(ctx.repo), "options": {"quick": quick}}
    doc.update(skipped={}, failed={})
    try:
        got = [r.finish() for r in run(ctx)]
    finally:
        ctx.close()
    print(report.markdown(doc, got))
    return 0


if __name__ == "__main__":
    sys.exit(main())
