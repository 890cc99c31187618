"""The step's data flow written by hand with ``async_call_engine`` and refs: what a corral
user wrote before the dispatch and weight-sync verbs (``train.flow=by_hand``), and the
baseline the verbs are measured against."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np


def split(value: Any, n: int) -> list[Any]:
    """``value`` cut into ``n`` consecutive shards along its first dimension."""
    if isinstance(value, dict):
        parts = {k: split(v, n) for k, v in value.items()}
        return [{k: parts[k][i] for k in value} for i in range(n)]
    if isinstance(value, list):
        return [value[s.start : s.stop] for s in _ranges(len(value), n)]
    arr = np.asarray(value)
    return [arr[s] for s in _ranges(len(arr), n)]


def _ranges(length: int, n: int) -> list[slice]:
    bounds = np.linspace(0, length, n + 1).round().astype(int)
    return [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def concat(results: list[dict]) -> dict:
    return {
        k: np.concatenate([np.atleast_1d(np.asarray(r[k])) for r in results]) for k in results[0]
    }


async def dispatch(
    sched, ids: list[str], method: str, engine: str, *args: Any, collect: str
) -> Any:
    """Call ``method`` on every worker of ``ids`` with its shard of each argument."""
    shards = [split(a, len(ids)) for a in args]
    meta = {"keep": True} if collect == "refs" else None
    results = await asyncio.gather(
        *(
            sched.async_call_engine(w, method, engine, *(s[i] for s in shards), rpc_meta=meta)
            for i, w in enumerate(ids)
        )
    )
    return concat(results) if collect == "concat" else list(results)


async def sync_weights(sched, ids: dict[str, list[str]], version: int) -> None:
    """Trainer 0's weights as a ref, which every rollout worker fetches from it."""
    ref = await sched.async_call_engine(
        ids["trainer"][0], "weights", "trainer", rpc_meta={"keep": True}
    )
    await asyncio.gather(
        *(
            sched.async_call_engine(w, "load_weights", "policy", ref, version)
            for w in ids["rollout"]
        )
    )
    ref.free()
