"""The small config class the specification's training-script example needs."""

from __future__ import annotations

from dataclasses import dataclass, field

from corral import BaseExperimentConfig, SchedulingSpec, SchedulingStrategy


@dataclass
class RolloutConfig:
    n_replicas: int = 2


@dataclass
class GRPOConfig(BaseExperimentConfig):
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    scheduling_spec: list[SchedulingSpec] = field(default_factory=lambda: [SchedulingSpec()])
    scheduling_strategy: SchedulingStrategy = field(default_factory=SchedulingStrategy)
