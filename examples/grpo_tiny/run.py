"""GRPO on a small transformer through corral: reverse a digit string, on local, Ray or Slurm.

    python examples/grpo_tiny/run.py                          # local, 10 M parameters
    python examples/grpo_tiny/run.py scheduler.type=ray model.size=25m train.steps=80
    python examples/grpo_tiny/run.py scheduler.type=slurm cluster.fileroot=/shared/corral

Roles: ``rollout`` workers generate (HF ``generate``, a group of completions per prompt),
a ``reward`` helper forked next to each scores them, two ``trainer`` workers take GRPO
steps with gloo DDP; the new weights go to every rollout worker each step. Prints each
step's reward, loss and time per phase, a summary, and writes a learning-curve PNG.
Ctrl-C at any point stops every worker.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:  # run as a script: make ``examples.grpo_tiny`` importable (workers too)
    sys.path.insert(0, ROOT)

from corral import BaseExperimentConfig, load_expr_config, make_scheduler  # noqa: E402
from examples.grpo_tiny.config import GRPOTinyConfig, check  # noqa: E402
from examples.grpo_tiny.job import GRPOJob, StepStats  # noqa: E402

PHASES = ("generate", "reward", "train", "sync")


def say(text: str) -> None:
    print(text, flush=True)


@dataclass
class RunResult:
    steps: list[StepStats]
    startup: float
    params: int

    def mean_reward(self, first: bool, k: int = 10) -> float:
        part = self.steps[:k] if first else self.steps[-k:]
        return sum(s.reward for s in part) / max(1, len(part))


def progress_line(s: StepStats, steps: int) -> str:
    phases = " ".join(f"{p} {s.seconds[p]:5.2f}" for p in PHASES)
    share = 100 * s.corral / s.total
    return (
        f"  step {s.step:3d}/{steps}  reward {s.reward:.3f}  loss {s.loss:+.4f}  "
        f"| {phases} s | corral {s.corral:.3f} s ({share:.1f} %)"
    )


def train(job: GRPOJob, steps: int, on_step=say) -> list[StepStats]:
    """``steps`` GRPO steps; ``on_step`` gets each step's progress line."""

    async def loop() -> list[StepStats]:
        out = []
        for n in range(1, steps + 1):
            out.append(await job.step(n))
            on_step(progress_line(out[-1], steps))
        return out

    return asyncio.run(loop())


def summary(cfg: GRPOTinyConfig, r: RunResult) -> str:
    steps = r.steps
    total = sum(s.total for s in steps)
    rows = [
        ("backend", cfg.scheduler.type),
        (
            "model",
            f"{cfg.model.size} ({r.params / 1e6:.1f} M parameters, Llama-style, random init)",
        ),
        (
            "task",
            f"reverse {cfg.task.digits} digits; {cfg.task.prompts} prompts x {cfg.task.group} per step",
        ),
        (
            "workers",
            f"rollout {cfg.train.rollout} + reward {cfg.train.rollout} (forked) + trainer {cfg.train.trainers}",
        ),
        ("data flow", cfg.train.flow),
        ("mean reward, first 10 steps", f"{r.mean_reward(True):.3f}"),
        ("mean reward, last 10 steps", f"{r.mean_reward(False):.3f}"),
        ("startup", f"{r.startup:.1f} s"),
        ("steps", f"{len(steps)} in {total:.1f} s ({total / len(steps):.2f} s each)"),
    ]
    for p in PHASES:
        rows.append(
            (f"  {p}", f"{sum(s.seconds[p] for s in steps) / total * 100:5.1f} % of step time")
        )
    corral = sum(s.corral for s in steps)
    rows.append(
        (
            "corral's share",
            f"{corral / total * 100:5.1f} % (scheduling, RPC, dispatch, weight sync)",
        )
    )
    width = max(len(k) for k, _ in rows)
    lines = ["", "  summary", "  " + "-" * (width + 50)]
    lines += [f"  {k:<{width}}  {v}" for k, v in rows]
    return "\n".join(lines + ["  " + "-" * (width + 50)])


def main(argv: list[str]) -> RunResult:
    cfg, _ = load_expr_config(argv, GRPOTinyConfig)
    check(cfg)
    if cfg.trial_name == "trial0":
        cfg.trial_name = time.strftime("run-%Y%m%d-%H%M%S")
    cfg.cluster.n_gpus_per_node = 0
    from examples.grpo_tiny.model import build_model, n_params

    params = n_params(build_model(cfg.model.size))
    extra = {}
    joins = cfg.scheduler.ray.address or os.environ.get("RAY_ADDRESS")
    if cfg.scheduler.type == "ray" and not joins:  # a runtime started here: enough CPUs
        extra["init_kwargs"] = {"num_cpus": max(8, os.cpu_count() or 1)}
    say(
        f"GRPO on {cfg.scheduler.type}: {cfg.model.size} model ({params / 1e6:.1f} M), "
        f"{cfg.train.rollout} rollout + {cfg.train.rollout} reward + {cfg.train.trainers} trainer workers, "
        f"{cfg.train.steps} steps"
    )
    t0 = time.monotonic()
    # the workers get corral's part of the config only (the job's sections stay here)
    base = BaseExperimentConfig(
        experiment_name=cfg.experiment_name,
        trial_name=cfg.trial_name,
        cluster=cfg.cluster,
        scheduler=cfg.scheduler,
    )
    sched = make_scheduler(base, progress=lambda text: say(f"  .. {text}"), **extra)
    try:
        job = GRPOJob(sched, cfg)
        job.start()
        startup = time.monotonic() - t0
        pids = " ".join(f"{w.id}={w.pid}" for r in job.ids for w in sched.get_workers(r))
        say(f"  .. workers and engines ready in {startup:.1f} s; pids {pids}")
        result = RunResult(train(job, cfg.train.steps), startup, params)
    except KeyboardInterrupt:
        say("\n  .. interrupted: stopping every worker")
        raise
    finally:
        t = time.monotonic()
        sched.close()
        say(f"  .. all workers stopped in {time.monotonic() - t:.2f} s")
    say(summary(cfg, result))
    if cfg.output.png:
        from examples.grpo_tiny.plot import learning_curve_png

        title = (
            f"GRPO, reverse {cfg.task.digits} digits, {cfg.model.size} model, {cfg.scheduler.type}"
        )
        learning_curve_png(cfg.output.png, [s.reward for s in result.steps], title)
        say(f"  learning curve: {cfg.output.png}")
    return result


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except KeyboardInterrupt:
        sys.exit(130)
