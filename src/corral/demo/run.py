"""Run the demo job and print live progress and a summary."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from corral.config import BaseExperimentConfig, make_scheduler
from corral.spec import Job, SchedulingSpec, SchedulingStrategy

E = "corral.demo.engines"


@dataclass
class DemoResult:
    steps: int
    first_reward: float
    last_reward: float
    learner_backend: str
    seconds: float
    startup_seconds: float
    log_dir: str
    worker_ids: dict


def say(text: str) -> None:
    print(text, flush=True)


async def _create(sched, ids: list[str], engine: str, name: str, **kwargs: Any) -> None:
    await asyncio.gather(*(sched.create_engine(w, engine, name, **kwargs) for w in ids))


async def _step(
    sched, rollout, helpers, trainers, batch, version, numpy_mode
) -> tuple[float, dict]:
    samples = await asyncio.gather(
        *(sched.async_call_engine(w, "generate", "policy", batch) for w in rollout)
    )
    actions = [s["actions"] for s in samples]
    rewards = await asyncio.gather(
        *(
            sched.async_call_engine(h, "score", "reward", a)
            for h, a in zip(helpers, actions, strict=True)
        )
    )
    all_actions = np.concatenate(actions)
    all_rewards = np.concatenate(rewards)
    shards = np.array_split(np.arange(len(all_actions)), len(trainers))
    outs = await asyncio.gather(
        *(
            sched.async_call_engine(t, "train_step", "learner", all_actions[s], all_rewards[s])
            for t, s in zip(trainers, shards, strict=True)
        )
    )
    if numpy_mode and len(trainers) > 1:
        grad = np.mean([o["grad"] for o in outs], axis=0)
        weights = (
            await asyncio.gather(
                *(sched.async_call_engine(t, "apply", "learner", grad) for t in trainers)
            )
        )[0]
    else:
        weights = outs[0]["weights"]
    await asyncio.gather(
        *(sched.async_call_engine(w, "update_weights", "policy", weights, version) for w in rollout)
    )
    return float(all_rewards.mean()), {"weights": weights}


def quiet_ray(init_kwargs: dict) -> None:
    """Keep Ray's driver-side log lines (INFO, WARNING) and its processes' backend logs
    off the terminal; errors still show."""
    import logging

    import ray  # noqa: F401 (importing ray sets its logger's level: lower it after)

    init_kwargs["logging_level"] = logging.ERROR
    logging.getLogger("ray").setLevel(logging.ERROR)


def run_demo(
    scheduler_type: str = "local",
    steps: int = 20,
    batch: int = 64,
    rollout_replicas: int = 2,
    trainer_replicas: int = 2,
    fileroot: str | None = None,
    experiment: str = "demo",
    trial: str | None = None,
    use_torch: bool | None = None,
    overrides: dict | None = None,
    verbose: bool = False,
) -> DemoResult:
    """``verbose``: let the backend's own log lines (Ray's INFO and WARNING) through."""
    cfg = BaseExperimentConfig(
        experiment_name=experiment, trial_name=trial or time.strftime("run-%Y%m%d-%H%M%S")
    )
    cfg.scheduler.type = scheduler_type
    if fileroot:
        cfg.cluster.fileroot = fileroot
    cfg.cluster.n_gpus_per_node = 0
    for key, value in (overrides or {}).items():
        obj = cfg
        *path, last = key.split(".")
        for part in path:
            obj = getattr(obj, part)
        setattr(obj, last, value)
    t0 = time.monotonic()
    say(
        f"corral demo on {scheduler_type}: {rollout_replicas} rollout + {rollout_replicas} forked reward "
        f"helpers + {trainer_replicas} trainers, {steps} steps"
    )
    extra = {}
    if scheduler_type == "ray":
        # A runtime the demo starts itself declares logical CPUs, so the 6 small workers
        # fit on a laptop; a cluster it joins is used as it is.
        address = cfg.scheduler.ray.address or os.environ.get("RAY_ADDRESS") or "local"
        extra["init_kwargs"] = {}
        if address == "local":  # joining a cluster: ray.init refuses num_cpus
            extra["init_kwargs"]["num_cpus"] = max(8, os.cpu_count() or 1)
        if not verbose:  # the demo's own lines only (Ray's: corral demo --verbose)
            quiet_ray(extra["init_kwargs"])
    sched = make_scheduler(cfg, progress=lambda text: say(f"  .. {text}"), **extra)
    try:
        rollout = sched.create_workers(
            Job("rollout", rollout_replicas, [SchedulingSpec(cpu=1, mem=1)])
        )
        helpers = sched.create_workers(
            Job(
                "reward",
                rollout_replicas,
                [SchedulingSpec(cpu=0, mem=1)],
                SchedulingStrategy("colocation", target="rollout", fork=True),
            )
        )
        trainers = sched.create_workers(
            Job("trainer", trainer_replicas, [SchedulingSpec(cpu=1, mem=1)])
        )

        async def main() -> DemoResult:
            await _create(sched, rollout, f"{E}.Policy", "policy")
            await _create(sched, helpers, f"{E}.RewardModel", "reward")
            await _create(sched, trainers, f"{E}.Learner", "learner", use_torch=use_torch)
            backend = sched.call_engine(trainers[0], "backend", "learner")
            startup = time.monotonic() - t0
            say(
                f"  .. all {len(rollout) * 2 + len(trainers)} workers and engines ready in {startup:.1f}s; "
                f"learners use {backend}"
            )
            numpy_mode = backend == "numpy"
            rewards = []
            for step in range(1, steps + 1):
                t = time.monotonic()
                reward, _ = await _step(sched, rollout, helpers, trainers, batch, step, numpy_mode)
                rewards.append(reward)
                bar = "#" * max(0, int((reward + 1) * 10))
                say(
                    f"  step {step:3d}/{steps}  reward {reward:+.3f}  {bar:<20}  {1000 * (time.monotonic() - t):6.1f} ms"
                )
            return DemoResult(
                steps=steps,
                first_reward=float(np.mean(rewards[:3])),
                last_reward=float(np.mean(rewards[-3:])),
                learner_backend=backend,
                seconds=time.monotonic() - t0,
                startup_seconds=startup,
                log_dir=str(sched.log_dir),
                worker_ids={"rollout": rollout, "reward": helpers, "trainer": trainers},
            )

        result = asyncio.run(main())
    finally:
        t = time.monotonic()
        sched.close()
        say(f"  .. all workers stopped in {time.monotonic() - t:.2f}s")
    print_summary(result, scheduler_type)
    return result


def print_summary(r: DemoResult, backend: str) -> None:
    rows = [
        ("backend", backend),
        ("workers", ", ".join(f"{k}: {len(v)}" for k, v in r.worker_ids.items())),
        ("learner", r.learner_backend),
        ("steps", str(r.steps)),
        ("reward (first 3 steps)", f"{r.first_reward:+.3f}"),
        ("reward (last 3 steps)", f"{r.last_reward:+.3f}"),
        ("startup", f"{r.startup_seconds:.1f} s"),
        ("total", f"{r.seconds:.1f} s"),
        ("logs", r.log_dir),
    ]
    width = max(len(k) for k, _ in rows)
    say("\n  summary")
    say("  " + "-" * (width + 40))
    for k, v in rows:
        say(f"  {k:<{width}}  {v}")
    say("  " + "-" * (width + 40))


if __name__ == "__main__":
    run_demo(*(sys.argv[1:2] or ["local"]))
