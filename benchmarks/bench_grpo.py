"""corral's share of a real RL step: examples/grpo_tiny at two model sizes (rows ``grpo.*``).

    python benchmarks/run.py --backends grpo [--quick]

Sizes: 10m and 25m (``--quick``: tiny and 10m). For each size the same GRPO steps
(16 prompts x 8 completions, 2 rollout workers with forked reward helpers, 2 DDP trainers)
run three ways, in this run:

* corral, local backend, the verbs (``dispatch`` by rank, a gloo weight-sync group);
* the same loop as plain objects in one process (``examples/grpo_tiny/one_process.py``);
* the same loop hand-written with ``torch.distributed`` (``examples/grpo_tiny/hand_dist.py``).

A step's *share* is everything but generate, reward and train compute (each phase's
slowest worker, measured inside the engines): scheduling, RPC, dispatch, weight sync.

Rows per size ``S``:

* ``grpo.S.share``: corral's share of step time, in %, next to the hand-written loop's
  share; goal <= 2 %.
* ``grpo.S.step``: corral's step time vs the one-process loop (one trainer takes the
  whole batch there, so a ratio below 1 is the two trainers' parallelism).
* ``grpo.S.weight_sync.group`` / ``.ref``: trainer 0's weights to the 2 rollout workers,
  in the gloo group (the verbs) or as a ref each fetches (shared memory), vs the memcpy
  bound: one in-process copy of the weights per reader; goal <= 1.3x.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

from common import BackendUnavailable, Context, Row, Target, log, median, rounded

NAME = "grpo"
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if REPO not in sys.path:
    sys.path.insert(0, REPO)


def check() -> str | None:
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        return f"{exc.name} is not installed (pip install -e .[torch,examples])"
    return None


def _config(ctx: Context, size: str):
    from examples.grpo_tiny.config import GRPOTinyConfig, check

    cfg = GRPOTinyConfig(experiment_name=ctx.unique_name("grpo"), trial_name="t0")
    cfg.model.size = size
    cfg.cluster.fileroot = ctx.fileroot
    cfg.cluster.n_gpus_per_node = 0
    return check(cfg)


def _share(compute: list[dict], totals: list[float]) -> float:
    """The non-compute part of the summed step time, in %."""
    busy = sum(sum(c[k] for k in ("generate", "reward", "train")) for c in compute)
    return 100 * (sum(totals) - busy) / sum(totals)


def _corral(ctx: Context, size: str, steps: int, reps: int) -> dict:
    from corral.backends.local import LocalScheduler
    from examples.grpo_tiny import by_hand
    from examples.grpo_tiny.job import GRPOJob
    from examples.grpo_tiny.model import build_model, n_params

    cfg = _config(ctx, size)
    sched = LocalScheduler(exp_config=cfg, gpu_devices=[], progress=lambda t: None)
    try:
        job = GRPOJob(sched, cfg)
        job.start()

        async def measure() -> dict:
            await job.step(0)  # warm-up: first generate, first group use
            stats = [await job.step(n) for n in range(1, steps + 1)]
            group, ref = [], []
            for v in range(reps):
                t = time.perf_counter()
                await job.sync(100 + v)
                group.append(time.perf_counter() - t)
                t = time.perf_counter()
                await by_hand.sync_weights(sched, job.ids, 200 + v)
                ref.append(time.perf_counter() - t)
            return {"stats": stats, "group": group, "ref": ref}

        out = asyncio.run(measure())
    finally:
        sched.close()
    out["nbytes"] = 4 * n_params(build_model(size))
    return out


def _one_process(ctx: Context, size: str, steps: int) -> list:
    from examples.grpo_tiny.one_process import OneProcessJob

    job = OneProcessJob(_config(ctx, size))
    job.step(0)
    return [job.step(n) for n in range(1, steps + 1)]


def _memcpy(nbytes: int, reps: int) -> list[float]:
    import numpy as np

    src = np.arange(nbytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t)
    return times


def bench_size(ctx: Context, size: str, steps: int, reps: int) -> list[Row]:
    from examples.grpo_tiny.hand_dist import run_hand_dist

    log(f"grpo {size}: corral (local, verbs), {steps} steps")
    c = _corral(ctx, size, steps, reps)
    log(f"grpo {size}: one process, {steps} steps")
    one = _one_process(ctx, size, steps)
    log(f"grpo {size}: hand-written torch.distributed, {steps} steps")
    hand = run_hand_dist(_config(ctx, size), steps + 1)[1:]
    stats = c["stats"]
    corral_share = _share([s.compute for s in stats], [s.total for s in stats])
    hand_share = _share(hand, [h["total"] for h in hand])
    one_share = _share([s.compute for s in one], [s.total for s in one])
    readers = 2
    bound = [readers * t for t in _memcpy(c["nbytes"], reps)]
    log(
        f"grpo {size}: share corral {corral_share:.2f} %, hand {hand_share:.2f} %, "
        f"one process {one_share:.2f} %; sync group {median(c['group']):.3f} s, "
        f"ref {median(c['ref']):.3f} s, memcpy bound {median(bound):.4f} s"
    )
    common = {"size": size, "steps": steps, "weights_bytes": c["nbytes"]}
    steps_s = {
        "corral_step_s": rounded(s.total for s in stats),
        "corral_share_s": rounded(s.corral for s in stats),
        "hand_step_s": rounded(h["total"] for h in hand),
        "one_process_step_s": rounded(s.total for s in one),
    }
    sync_rows = [
        Row(
            key=f"grpo.{size}.weight_sync.{how}",
            backend=NAME,
            label=f"weight sync {size} ({c['nbytes'] / 2**20:.0f} MiB) to 2 rollout workers, {what}, vs memcpy bound",
            unit="s",
            value=median(c[how]),
            baseline=median(bound),
            baseline_label="one in-process copy of the weights per reader",
            targets=[Target("ratio", "<=", 1.3, "<= 1.3x the memcpy bound")],
            samples={"corral_s": rounded(c[how]), "baseline_s": rounded(bound)},
            extra=common,
        )
        for how, what in (("group", "gloo group (verbs)"), ("ref", "ref fetched by each"))
    ]
    return [
        Row(
            key=f"grpo.{size}.share",
            backend=NAME,
            label=f"corral's share of a GRPO step ({size}): scheduling, RPC, dispatch, weight sync",
            unit="% of step",
            value=corral_share,
            baseline=hand_share,
            baseline_label="the same share of the loop hand-written with torch.distributed",
            targets=[Target("abs", "<=", 2.0, "<= 2 % of step time")],
            samples=steps_s,
            extra=dict(common, one_process_share=round(one_share, 3)),
        ),
        Row(
            key=f"grpo.{size}.step",
            backend=NAME,
            label=f"GRPO step time ({size}), corral local vs one process",
            unit="s",
            value=median(s.total for s in stats),
            baseline=median(s.total for s in one),
            baseline_label="the roles as plain objects in one process (one trainer, no DP)",
            samples=steps_s,
            extra=dict(common, hand_step_median_s=round(median(h["total"] for h in hand), 4)),
        ),
        *sync_rows,
    ]


def run(ctx: Context) -> list[Row]:
    why = check()
    if why:
        raise BackendUnavailable(why)
    sizes = ("tiny", "10m") if ctx.quick else ("10m", "25m")
    steps, reps = (2, 3) if ctx.quick else (4, 5)
    rows: list[Row] = []
    for size in sizes:
        rows += bench_size(ctx, size, steps, reps)
    return rows
