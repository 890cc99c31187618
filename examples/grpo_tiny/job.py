"""The GRPO job on a corral scheduler: its roles, engines and one RL step.

Which corral call each part of the step uses (docs/from-toy-to-real.md):

* prompts -> rollout workers: ``dispatch(mode="split")``, each worker gets its rank's share;
* completions -> the reward helper forked next to each rollout worker: ``dispatch`` of the
  rollout results left as refs, so each helper fetches its neighbour's batch itself;
* scored batch -> trainers: ``dispatch(mode="split")`` by DP rank, results concatenated;
* new weights trainer rank 0 -> every rollout worker: a broadcast in the process group
  ``create_process_group("weights", roles=["trainer/0", "rollout"])`` sets up.

``train.flow=by_hand`` runs the same step with plain ``async_call_engine`` per worker and
the weights as a ``corral.Ref`` (the way to write it without the verbs).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import numpy as np

from corral import Job, SchedulingSpec, SchedulingStrategy
from examples.grpo_tiny import by_hand
from examples.grpo_tiny.config import GRPOTinyConfig
from examples.grpo_tiny.task import make_prompts

E = "examples.grpo_tiny.engines"
GROUP = "weights"
TRAINER = "trainer"


@dataclass
class StepStats:
    step: int
    reward: float
    loss: float
    clipped: float
    seconds: dict[str, float]  # generate, reward, train, sync: wall time of each phase
    compute: dict[str, float]  # generate, reward, train: the slowest worker's own compute
    total: float

    @property
    def corral(self) -> float:
        """Everything but generate/reward/train compute: scheduling, RPC, dispatch, sync."""
        return self.total - sum(self.compute.values())


@dataclass
class GRPOJob:
    sched: object
    cfg: GRPOTinyConfig
    ids: dict[str, list[str]] = field(default_factory=dict)

    def start(self) -> None:
        """Create the roles and their engines (and the weight-sync group)."""
        t, cfg = self.cfg.train, self.cfg
        spec = [SchedulingSpec(cpu=1, gpu=0, mem=1)]
        self.ids["rollout"] = self.sched.create_workers(Job("rollout", t.rollout, spec))
        self.ids["reward"] = self.sched.create_workers(
            Job(
                "reward",
                t.rollout,
                [SchedulingSpec(cpu=0, gpu=0, mem=1)],
                SchedulingStrategy("colocation", target="rollout", fork=True),
            )
        )
        self.ids["trainer"] = self.sched.create_workers(Job("trainer", t.trainers, spec))
        model = {"size": cfg.model.size, "seed": cfg.model.seed}
        policy = dict(model, group=cfg.task.group, temperature=cfg.task.temperature)
        trainer = dict(model, lr=t.lr, clip=t.clip, updates=t.updates)

        async def create() -> None:
            await asyncio.gather(
                *(
                    self.sched.create_engine(w, f"{E}.Policy", "policy", **policy)
                    for w in self.ids["rollout"]
                ),
                *(
                    self.sched.create_engine(w, f"{E}.Scorer", "reward", group=cfg.task.group)
                    for w in self.ids["reward"]
                ),
                *(
                    self.sched.create_engine(w, f"{E}.Trainer", "trainer", **trainer)
                    for w in self.ids["trainer"]
                ),
            )

        asyncio.run(create())
        if t.flow == "verbs":
            self.sched.create_process_group(GROUP, roles=[f"{TRAINER}/0", "rollout"])

    async def step(self, n: int) -> StepStats:
        """One GRPO step: generate, score, train, sync weights; timed phase by phase."""
        cfg = self.cfg
        send = self.sched.async_dispatch if cfg.train.flow == "verbs" else self._by_hand
        seconds, compute = {}, {}
        t0 = time.perf_counter()
        prompts = make_prompts(
            cfg.task.prompts, cfg.task.digits, seed=1_000_003 * cfg.model.seed + n
        )
        rollouts = await send(
            "rollout", "generate", "policy", prompts, mode="split", collect="refs"
        )
        t1 = time.perf_counter()
        seconds["generate"] = t1 - t0
        compute["generate"] = max(float(r["seconds"]) for r in rollouts)
        scored = await send(
            "reward", "score", "reward", list(rollouts), mode="split", collect="concat"
        )
        t2 = time.perf_counter()
        seconds["reward"] = t2 - t1
        compute["reward"] = float(np.max(scored.pop("seconds")))
        out = await send("trainer", "train", "trainer", scored, mode="split", collect="concat")
        t3 = time.perf_counter()
        seconds["train"] = t3 - t2
        compute["train"] = float(np.max(out["seconds"]))
        await self.sync(n)
        t4 = time.perf_counter()
        seconds["sync"] = t4 - t3
        return StepStats(
            step=n,
            reward=float(np.mean(scored["rewards"])),
            loss=float(np.mean(out["loss"])),
            clipped=float(np.mean(out["clipped"])),
            seconds=seconds,
            compute=compute,
            total=t4 - t0,
        )

    async def sync(self, version: int) -> None:
        """Trainer rank 0's weights to every rollout worker."""
        if self.cfg.train.flow == "verbs":
            await asyncio.gather(
                self.sched.async_dispatch(
                    "trainer", "send_weights", "trainer", GROUP, mode="rank0"
                ),
                self.sched.async_dispatch(
                    "rollout", "receive_weights", "policy", GROUP, version, mode="all"
                ),
            )
        else:
            await by_hand.sync_weights(self.sched, self.ids, version)

    async def _by_hand(self, role, method, engine, *args, mode, collect):
        return await by_hand.dispatch(
            self.sched, self.ids[role], method, engine, *args, collect=collect
        )

    def digests(self) -> dict[str, list[str]]:
        """sha256 of the weights on every trainer and rollout worker."""
        return {
            role: [self.sched.call_engine(w, "weights_digest", engine) for w in self.ids[role]]
            for role, engine in (("trainer", "trainer"), ("rollout", "policy"))
        }
