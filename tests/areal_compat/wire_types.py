"""Types sent to workers in the compatibility tests. Workers have not imported this
module: rebuilding these values there proves the worker imports the caller's module."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from corral import BaseExperimentConfig


class Color(enum.Enum):
    red = "red"
    blue = "blue"


@dataclass
class Sample:
    prompt: str
    color: Color = Color.red
    tags: list[str] = field(default_factory=list)


@dataclass
class SeededConfig(BaseExperimentConfig):
    """An experiment config with a ``seed``, as AReaL's have."""

    seed: int = 1


@dataclass
class ConfigWithAClass(SeededConfig):
    """A config the wire cannot carry whole (a class as a value)."""

    engine_class: type = Sample
