"""The example's configuration: corral's experiment config plus the job's own sections.

Every field can be set on the command line as a dotted override, e.g.
``scheduler.type=ray model.size=25m train.steps=80``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from corral import BaseExperimentConfig, ConfigError
from examples.grpo_tiny.model import check_size


@dataclass
class ModelConfig:
    size: str = "10m"  # tiny | 10m | 25m | 50m (examples/grpo_tiny/model.py)
    seed: int = 0


@dataclass
class TaskConfig:
    digits: int = 3  # reverse strings of this many digits
    prompts: int = 16  # prompts per step (over all rollout workers)
    group: int = 8  # completions sampled per prompt (GRPO's group)
    temperature: float = 1.0


@dataclass
class TrainConfig:
    steps: int = 60
    lr: float = 3e-4
    clip: float = 0.2
    updates: int = 2  # optimizer steps per batch (the ratio leaves 1 after the first)
    rollout: int = 2  # rollout workers (each with a forked reward helper)
    trainers: int = 2
    flow: str = "verbs"  # verbs: sched.dispatch + a weight-sync group; by_hand: call_engine + refs


@dataclass
class OutputConfig:
    png: str = "grpo_tiny_curve.png"  # the learning curve ("" for none)


@dataclass
class GRPOTinyConfig(BaseExperimentConfig):
    experiment_name: str = "grpo-tiny"
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    output: OutputConfig = field(default_factory=OutputConfig)


def check(cfg: GRPOTinyConfig) -> GRPOTinyConfig:
    """Bad values raise before anything starts, naming the field and the fix."""
    check_size(cfg.model.size)
    rules = [
        ("task.digits", cfg.task.digits, 1 <= cfg.task.digits <= 20, "use 1..20"),
        ("task.group", cfg.task.group, cfg.task.group >= 2, "GRPO needs at least 2 per group"),
        ("train.rollout", cfg.train.rollout, cfg.train.rollout >= 1, "use at least 1"),
        ("train.trainers", cfg.train.trainers, cfg.train.trainers >= 1, "use at least 1"),
        ("train.steps", cfg.train.steps, cfg.train.steps >= 1, "use at least 1"),
        ("train.flow", cfg.train.flow, cfg.train.flow in ("verbs", "by_hand"), "verbs or by_hand"),
        (
            "task.prompts",
            cfg.task.prompts,
            cfg.task.prompts % cfg.train.rollout == 0
            and cfg.task.prompts * cfg.task.group % (cfg.train.trainers * cfg.train.updates) == 0,
            "a multiple of train.rollout whose prompts x group splits evenly over "
            "train.trainers x train.updates",
        ),
    ]
    for name, value, ok, fix in rules:
        if not ok:
            raise ConfigError(name, value, fix)
    return cfg
