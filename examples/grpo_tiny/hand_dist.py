"""The same GRPO loop written by hand with ``torch.distributed``, without corral.

The benchmark's second baseline (benchmarks/bench_grpo.py): ``R`` rollout processes and
``R`` trainer processes started with ``torch.multiprocessing``, one gloo world. Every rank
makes the step's prompts from the seed and a rollout takes its rows (no dispatch needed);
it generates and scores them itself (the reward as a plain function), then sends its batch
to the trainer of the same index with ``send``/``recv``; trainers run DDP over their own
group; trainer 0 broadcasts the weights to the rollouts in a second group. What a user
would write to avoid any framework, fixed shapes and all.
"""

from __future__ import annotations

import os
import socket
import time

import numpy as np


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _proc(rank: int, world: int, port: int, cfg, steps: int, out) -> None:
    import torch
    import torch.distributed as dist

    from examples.grpo_tiny.by_hand import split
    from examples.grpo_tiny.engines import Policy, Scorer, Trainer, flat_params, load_flat
    from examples.grpo_tiny.task import make_prompts

    torch.set_num_threads(1)
    os.environ.pop("WORLD_SIZE", None)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    r = world // 2  # ranks 0..r-1 rollout, r..2r-1 trainers
    trainers = dist.new_group(list(range(r, world)))
    sync = dist.new_group([r, *range(r)])  # trainer 0 and every rollout
    m, t, task = cfg.model, cfg.train, cfg.task
    rows = task.prompts * task.group // r
    width = task.digits + 2, task.digits + 1
    if rank < r:
        policy, scorer = Policy(m.size, m.seed, task.group, task.temperature), Scorer(task.group)
        flat = flat_params(policy.model)
    else:
        trainer = Trainer(m.size, m.seed, t.lr, t.clip, t.updates)
        trainer.dp = torch.nn.parallel.DistributedDataParallel(
            trainer.model, process_group=trainers
        )
        flat = flat_params(trainer.model)
    for n in range(1, steps + 1):
        dist.barrier()
        t0 = time.perf_counter()
        compute = {"generate": 0.0, "reward": 0.0, "train": 0.0}
        if rank < r:
            prompts = make_prompts(task.prompts, task.digits, seed=1_000_003 * m.seed + n)
            batch = policy.generate(split(prompts, r)[rank])
            compute["generate"] = batch["seconds"]
            scored = scorer.score([batch])
            compute["reward"] = float(scored["seconds"][0])
            for key in ("prompts", "completions", "advantages", "rewards"):
                dist.send(torch.from_numpy(np.ascontiguousarray(scored[key])), dst=r + rank)
        else:
            got = {
                "prompts": torch.empty(rows, width[0], dtype=torch.int64),
                "completions": torch.empty(rows, width[1], dtype=torch.int64),
                "advantages": torch.empty(rows, dtype=torch.float32),
                "rewards": torch.empty(rows, dtype=torch.float32),
            }
            for key in ("prompts", "completions", "advantages", "rewards"):
                dist.recv(got[key], src=rank - r)
            res = trainer.train({k: v.numpy() for k, v in got.items()})
            compute["train"] = float(res["seconds"][0])
            flat = flat_params(trainer.model)
        if rank <= r:  # the sync group: trainer 0 sends, rollouts receive
            dist.broadcast(flat, src=r, group=sync)
            if rank < r:
                load_flat(policy.model, flat)
        total = time.perf_counter() - t0
        # the step's slowest compute per phase, gathered on trainer 0
        mine = torch.tensor([compute["generate"], compute["reward"], compute["train"], total])
        every = [torch.zeros(4, dtype=torch.float64) for _ in range(world)]
        dist.all_gather(every, mine.double())
        dist.barrier()
        if rank == r:
            e = torch.stack(every)
            out.put(
                {
                    "generate": float(e[:, 0].max()),
                    "reward": float(e[:, 1].max()),
                    "train": float(e[:, 2].max()),
                    "total": float(e[:, 3].max()),
                }
            )
    dist.destroy_process_group()


def run_hand_dist(cfg, steps: int) -> list[dict]:
    """``steps`` steps; per step the slowest worker's compute per phase and the step time."""
    import torch.multiprocessing as mp

    world = 2 * cfg.train.rollout
    if cfg.train.trainers != cfg.train.rollout:
        raise ValueError("the hand-written baseline pairs each rollout with one trainer")
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_proc, args=(rank, world, port, cfg, steps, out), daemon=True)
        for rank in range(world)
    ]
    for p in procs:
        p.start()
    try:
        return [out.get(timeout=900) for _ in range(steps)]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
