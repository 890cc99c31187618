"""A worker's random generators seeded as AReaL's workers seed them: the experiment
config's ``seed`` plus the worker's rank (``POST /configure``)."""

from __future__ import annotations

import sys


def configure(payload: dict) -> dict:
    """``/configure``: the experiment config, role and rank to keep, after seeding the
    random generators from the config's ``seed`` plus the rank when it has one, as AReaL's
    workers do.

    The config is kept as it arrived: its dataclasses are rebuilt only if their classes are
    loaded in the worker already, else each stays a ``wire.DataclassRecord`` (a dict of its
    fields that becomes the dataclass again wherever it is sent). Importing the config's
    module to rebuild it (``corral.config``: dataclasses, inspect, typing, ~30 ms of CPU)
    in every new worker at once was most of ``create_workers``' time after registration
    (issue 29), for a value nothing in the worker reads.
    """
    config = payload.get("config")
    seed = find_seed(config)
    if seed is not None:
        seed_everything(seed + int(payload.get("rank") or 0))
    return {"config": config, "role": payload.get("role"), "rank": payload.get("rank")}


def find_seed(config: object) -> int | None:
    """The config's ``seed`` (a dict key, a ``DataclassRecord``'s field or an attribute),
    if it is an int."""
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
