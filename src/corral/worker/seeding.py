"""A worker's random generators seeded as AReaL's workers seed them: the experiment
config's ``seed`` plus the worker's rank (``POST /configure``)."""

from __future__ import annotations

import sys


def find_seed(config: object) -> int | None:
    """The config's ``seed`` (a dict key or an attribute), if it is an int."""
    seed = config.get("seed") if isinstance(config, dict) else getattr(config, "seed", None)
    return seed if isinstance(seed, int) and not isinstance(seed, bool) else None


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's and torch's generators (the last two only if loaded)."""
    import random

    random.seed(seed)
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed(seed % (1 << 32))
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(seed)
