"""Dispatch: call one engine method on every worker of a role, the batch split by
data-parallel rank, and collect the results in rank order.

``Scheduler.dispatch`` / ``Scheduler.async_dispatch`` delegate here. This module receives
what it needs explicitly (:class:`DispatchPorts`); it never reads the scheduler.

Modes (``mode=``):

* ``"split"`` (default): rank ``r`` of ``k`` gets rows ``corral.shards.bounds(n, k)[r]`` of
  every split argument (a list, numpy array, torch tensor or ``corral.Ref`` to one, also
  inside dicts and tuples); other arguments go whole to every rank. A Ref is split **on its
  owner** (``/data/split``: views, no copy) into one Ref per rank, and each worker fetches
  its own rows from the owner: the controller sends only refs.
* ``"all"``: the same arguments to every worker.
* ``"rank0"``: only the role's first worker is called; its result is returned (not a list).
* ``"engine"``: the engine's own data-parallel layout (AReaL's ``TrainEngine``:
  ``data_parallel_rank``, ``data_parallel_world_size``, ``is_data_parallel_head``):
  the batch is split over ``data_parallel_world_size``; each DP head gets its shard, the
  other ranks of its group an empty call with ``rpc_meta={"broadcast": True}`` (they take
  the head's arguments by ``torch.distributed`` broadcast, see ``corral.worker.broadcast``);
  results come from the heads, in DP rank order.

Collect (``collect=``): ``"concat"`` (``corral.shards.concat``), ``"list"`` (one result
per rank, rank order), ``"refs"`` (``rpc_meta["keep"]=True``: arrays and tensors of each
result stay on its worker and come back as ``corral.Ref``; a list in rank order).

Failures: every shard runs to its end; if any failed, every Ref made for the dispatch
(the shards of a split Ref, results kept with ``collect="refs"``) is freed, and the first
failure in rank order is raised (``WorkerFailedError`` naming the worker that died).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from corral import shards
from corral.errors import ConfigError
from corral.rpc.ref import Ref

MODES = ("split", "all", "rank0", "engine")
COLLECTS = ("concat", "list", "refs")


@dataclass(frozen=True)
class DispatchPorts:
    """What a dispatch needs from its controller, passed explicitly."""

    #: ``role -> [worker ids]`` in rank order (waits for a role launched with wait=False)
    worker_ids: Callable[[str], list[str]]
    #: ``(worker_id, method, engine_name, args, kwargs, rpc_meta) -> awaitable result``
    acall_engine: Callable[..., Awaitable[Any]]
    #: ``(worker_id, path, payload) -> awaitable reply``: a built-in route of a worker
    arequest: Callable[[str, str, Any], Awaitable[Any]]


def check(mode: Any, collect: Any, rpc_meta: Any) -> None:
    """Bad options are a ConfigError naming the field, before anything is sent."""
    if mode not in MODES:
        raise ConfigError("mode", mode, f"use one of {', '.join(map(repr, MODES))}")
    if collect not in COLLECTS:
        raise ConfigError("collect", collect, f"use one of {', '.join(map(repr, COLLECTS))}")
    if rpc_meta is not None and not isinstance(rpc_meta, dict):
        raise ConfigError("rpc_meta", rpc_meta, "pass a dict of call options, or None")


async def dispatch(
    ports: DispatchPorts,
    role: str,
    method: str,
    engine_name: str | None,
    args: tuple,
    kwargs: dict,
    mode: str = "split",
    collect: str = "concat",
    rpc_meta: dict | None = None,
) -> Any:
    """Run one dispatch (see the module docstring); the coroutine behind both verbs."""
    check(mode, collect, rpc_meta)
    meta = dict(rpc_meta or {})
    if collect == "refs":
        meta.setdefault("keep", True)
    ids = ports.worker_ids(role)
    if not ids:
        raise ConfigError("role", role, "dispatch to a role that has workers")
    if mode == "rank0":
        return await ports.acall_engine(ids[0], method, engine_name, list(args), kwargs, meta)
    if mode == "all":
        calls = [(wid, list(args), kwargs, meta) for wid in ids]
        return _collect(await _run_all(ports, method, engine_name, calls, []), collect)
    if mode == "engine":
        heads, others = await _layout(ports, ids, engine_name)
        made: list[Ref] = []
        shares = await _split(ports, args, kwargs, len(heads), made)
        meta = {**meta, "broadcast": True}
        calls = [(wid, a, k, meta) for wid, (a, k) in zip(heads, shares, strict=True)]
        calls += [(wid, [], {}, meta) for wid in others]
        results = await _run_all(ports, method, engine_name, calls, made)
        return _collect(results[: len(heads)], collect)
    made = []
    shares = await _split(ports, args, kwargs, len(ids), made)
    calls = [(wid, a, k, meta) for wid, (a, k) in zip(ids, shares, strict=True)]
    return _collect(await _run_all(ports, method, engine_name, calls, made), collect)


def _collect(results: list, collect: str) -> Any:
    return shards.concat(results) if collect == "concat" else results


async def _split(
    ports: DispatchPorts, args: tuple, kwargs: dict, k: int, made: list[Ref]
) -> list[tuple[list, dict]]:
    """``k`` shares of the call's arguments; Refs split on their owners (appended to
    ``made``, freed by the caller once the calls are over)."""
    n = shards.row_count(list(args), kwargs)
    if n is None:
        return [(list(args), dict(kwargs)) for _ in range(k)]
    spans = shards.bounds(n, k)
    refs = {id(v): v for _, v in shards.leaves((tuple(args), kwargs)) if isinstance(v, Ref)}
    split: dict[int, list[Ref]] = {}
    replies = await asyncio.gather(
        *(_split_ref(ports, r, spans) for r in refs.values()), return_exceptions=True
    )
    for key, parts in zip(refs, replies, strict=True):
        if not isinstance(parts, BaseException):
            split[key] = parts
            made.extend(parts)
    failed = [r for r in replies if isinstance(r, BaseException)]
    if failed:
        for ref in made:
            ref.free()
        made.clear()
        raise failed[0]
    pick = lambda ref: split[id(ref)]  # noqa: E731
    out = []
    for rank, span in enumerate(spans):
        a, kw = shards.take((tuple(args), kwargs), rank, span, pick)
        out.append((list(a), kw))
    return out


async def _split_ref(ports: DispatchPorts, ref: Ref, spans: list[tuple[int, int]]) -> list[Ref]:
    ref.check_usable()
    payload = {
        "key": ref.key,
        "trial": ref.trial,
        "generation": ref.generation,
        "spans": [list(s) for s in spans],
    }
    parts = await ports.arequest(ref.owner, "/data/split", payload)
    return list(parts)


async def _layout(
    ports: DispatchPorts, ids: list[str], engine_name: str | None
) -> tuple[list[str], list[str]]:
    """The DP heads in DP rank order, and the other workers."""
    layouts = await asyncio.gather(
        *(ports.arequest(wid, "/dp_layout", {"engine_name": engine_name}) for wid in ids)
    )
    heads = sorted(
        ((lay["dp_rank"], wid) for wid, lay in zip(ids, layouts, strict=True) if lay["head"]),
    )
    size = layouts[0]["dp_size"]
    if [r for r, _ in heads] != list(range(size)):
        raise ConfigError(
            "mode",
            "engine",
            f"the engines report data-parallel heads for ranks {[r for r, _ in heads]} but a "
            f"data_parallel_world_size of {size}: every DP rank needs exactly one head "
            "(initialize the engines first), or use mode='split'",
        )
    head_ids = [wid for _, wid in heads]
    return head_ids, [wid for wid in ids if wid not in head_ids]


async def _run_all(
    ports: DispatchPorts,
    method: str,
    engine_name: str | None,
    calls: list[tuple[str, list, dict, dict]],
    made: list[Ref],
) -> list:
    """Every call to its end; on any failure free every Ref made for the dispatch or
    returned by it, then raise the first failure in rank order."""
    try:
        results = await asyncio.gather(
            *(ports.acall_engine(wid, method, engine_name, a, k, m) for wid, a, k, m in calls),
            return_exceptions=True,
        )
    finally:
        for ref in made:
            ref.free()
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        for result in results:
            if not isinstance(result, BaseException):
                for ref in shards.refs_in(result):
                    ref.free()
        raise failed[0]
    return list(results)
