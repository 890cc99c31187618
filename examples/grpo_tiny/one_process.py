"""The same GRPO loop with the roles as plain objects in one process, without corral.

The benchmark's first baseline (benchmarks/bench_grpo.py): the same engines, the same
batch, the same weights copied to each rollout policy, but no workers, RPC or dispatch.
One trainer takes the whole batch (no DP), so its train time is the sum of what
corral's two trainers do in parallel.

    python examples/grpo_tiny/one_process.py model.size=tiny train.steps=100
"""

from __future__ import annotations

import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

from corral import load_expr_config  # noqa: E402
from examples.grpo_tiny.by_hand import concat, split  # noqa: E402
from examples.grpo_tiny.config import GRPOTinyConfig, check  # noqa: E402
from examples.grpo_tiny.engines import Policy, Scorer, Trainer, flat_params, load_flat  # noqa: E402
from examples.grpo_tiny.job import StepStats  # noqa: E402
from examples.grpo_tiny.task import make_prompts  # noqa: E402


class OneProcessJob:
    """The roles of ``GRPOJob`` as objects; ``step`` mirrors ``GRPOJob.step``."""

    def __init__(self, cfg: GRPOTinyConfig):
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        os.environ.pop("WORLD_SIZE", None)
        m, t = cfg.model, cfg.train
        self.cfg = cfg
        self.policies = [
            Policy(m.size, m.seed, cfg.task.group, cfg.task.temperature) for _ in range(t.rollout)
        ]
        self.scorers = [Scorer(cfg.task.group) for _ in range(t.rollout)]
        self.trainer = Trainer(m.size, m.seed, t.lr, t.clip, t.updates * t.trainers)

    def step(self, n: int) -> StepStats:
        cfg = self.cfg
        seconds: dict[str, float] = {}
        t0 = time.perf_counter()
        prompts = make_prompts(
            cfg.task.prompts, cfg.task.digits, seed=1_000_003 * cfg.model.seed + n
        )
        rollouts = [
            p.generate(s)
            for p, s in zip(self.policies, split(prompts, len(self.policies)), strict=True)
        ]
        t1 = time.perf_counter()
        scored = concat([s.score([r]) for s, r in zip(self.scorers, rollouts, strict=True)])
        scored.pop("seconds")
        t2 = time.perf_counter()
        out = self.trainer.train(scored)
        t3 = time.perf_counter()
        flat = flat_params(self.trainer.model)
        for p in self.policies:
            load_flat(p.model, flat)
        t4 = time.perf_counter()
        seconds = {"generate": t1 - t0, "reward": t2 - t1, "train": t3 - t2, "sync": t4 - t3}
        compute = {k: seconds[k] for k in ("generate", "reward", "train")}
        return StepStats(
            step=n,
            reward=float(np.mean(scored["rewards"])),
            loss=float(out["loss"][0]),
            clipped=float(out["clipped"][0]),
            seconds=seconds,
            compute=compute,
            total=t4 - t0,
        )


if __name__ == "__main__":
    from examples.grpo_tiny.run import progress_line

    cfg, _ = load_expr_config(sys.argv[1:], GRPOTinyConfig)
    job = OneProcessJob(check(cfg))
    for n in range(1, cfg.train.steps + 1):
        print(progress_line(job.step(n), cfg.train.steps), flush=True)
