"""examples/grpo_tiny on every backend: a few GRPO steps with real workers (tiny model).

The ``sched`` fixture (tests/conftest.py) gives a scheduler of each backend and, after
``close()``, asserts that the backend left nothing behind (processes, Ray actors and
placement groups, Slurm jobs, name-resolve entries)."""

from __future__ import annotations

import math

from examples.grpo_tiny.config import GRPOTinyConfig, check
from examples.grpo_tiny.job import GRPOJob
from examples.grpo_tiny.run import train

STEPS = 3


def tiny_config() -> GRPOTinyConfig:
    cfg = GRPOTinyConfig()
    cfg.model.size = "tiny"
    cfg.task.prompts = 4
    cfg.task.group = 4
    cfg.train.steps = STEPS
    cfg.train.lr = 0.01  # large, so that every step visibly changes the weights
    return check(cfg)


def test_grpo_steps_train_and_sync_weights_to_every_rollout_worker(sched):
    job = GRPOJob(sched, tiny_config())
    job.start()
    assert len(job.ids["reward"]) == len(job.ids["rollout"]) == 2
    assert len(job.ids["trainer"]) == 2
    before = job.digests()
    lines: list[str] = []
    stats = train(job, STEPS, on_step=lines.append)
    after = job.digests()

    assert [s.step for s in stats] == list(range(1, STEPS + 1))
    assert len(lines) == STEPS and all("reward" in line and "sync" in line for line in lines)
    for s in stats:
        assert math.isfinite(s.loss), s
        assert 0.0 <= s.reward <= 1.0, s
        assert set(s.seconds) == {"generate", "reward", "train", "sync"}
        assert s.compute["generate"] > 0 and s.compute["train"] > 0, s
    # the trainers moved, together (DDP), away from the initial weights ...
    assert after["trainer"][0] != before["trainer"][0]
    assert after["trainer"][1] == after["trainer"][0]
    # ... and every rollout worker holds exactly the trainer's weights after the sync
    assert after["rollout"] == [after["trainer"][0]] * len(after["rollout"]), after
