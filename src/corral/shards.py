"""Splitting a call's arguments by data-parallel rank, and joining the results back.

Pure functions (no request, no process): ``corral.controller.dispatch`` uses them, the unit tests
check them directly.

The split rule (numpy's ``array_split``): ``n`` rows over ``k`` ranks give the first
``n % k`` ranks ``n // k + 1`` rows and the others ``n // k``; rank ``r`` gets a contiguous
range, in rank order. With fewer rows than ranks the last ranks get empty shards (their
method is still called, so collectives inside it stay matched).

What is split: a ``list``, a numpy array, a torch tensor (along dim 0) and a
``corral.Ref`` to an array or tensor (split on its owner, see ``corral.controller.dispatch``).
``dict`` and ``tuple`` are walked and their split values split. Anything else (numbers,
strings, None, other objects) goes whole to every rank. Every split value of one call
must have the same number of rows.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from corral.errors import ConfigError
from corral.rpc.ref import Ref


def bounds(n: int, k: int) -> list[tuple[int, int]]:
    """``[(start, stop)]`` of each of ``k`` ranks over ``n`` rows (numpy's array_split)."""
    if k < 1:
        raise ConfigError("ranks", k, "dispatch to a role with at least one worker")
    base, extra = divmod(n, k)
    out, start = [], 0
    for rank in range(k):
        stop = start + base + (1 if rank < extra else 0)
        out.append((start, stop))
        start = stop
    return out


def _is_array(value: Any) -> bool:
    np = sys.modules.get("numpy")
    if np is not None and isinstance(value, np.ndarray):
        return True
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def is_splittable(value: Any) -> bool:
    """A value split by rows (a list, an array or tensor of 1 dim or more, a Ref)."""
    return isinstance(value, list | Ref) or (_is_array(value) and len(value.shape) > 0)


def _rows(value: Any, where: str) -> int:
    if isinstance(value, Ref):
        if not value.shape:
            raise ConfigError(where, value, "a Ref to split must hold an array of at least 1 dim")
        return value.shape[0]
    if isinstance(value, list):
        return len(value)
    return int(value.shape[0])


def leaves(tree: Any, where: str = "args") -> list[tuple[str, Any]]:
    """``[(path, value)]`` of every splittable value in ``tree`` (walking dicts/tuples)."""
    if is_splittable(tree):
        return [(where, tree)]
    if isinstance(tree, dict):
        return [p for k, v in tree.items() for p in leaves(v, f"{where}[{k!r}]")]
    if isinstance(tree, tuple):
        return [p for i, v in enumerate(tree) for p in leaves(v, f"{where}[{i}]")]
    return []


def row_count(args: list, kwargs: dict) -> int | None:
    """The number of rows every split value of the call has (None: nothing to split).
    Raises ConfigError naming two values that disagree, before anything is sent."""
    found = leaves(tuple(args), "args") + leaves(kwargs, "kwargs")
    if not found:
        return None
    first_where, first = found[0]
    n = _rows(first, first_where)
    for where, value in found[1:]:
        rows = _rows(value, where)
        if rows != n:
            raise ConfigError(
                where,
                f"{rows} rows",
                f"every split argument of one dispatch must have the same number of rows "
                f"({first_where} has {n}); pass mode='all' to send the same arguments to "
                "every worker",
            )
    return n


def take(tree: Any, rank: int, span: tuple[int, int], ref_shards: Callable[[Ref], list]) -> Any:
    """Rank ``rank``'s shard of ``tree``: rows ``span`` of every split value; a Ref is
    replaced by ``ref_shards(ref)[rank]`` (a Ref to the rows on its owner)."""
    if isinstance(tree, Ref):
        return ref_shards(tree)[rank]
    if is_splittable(tree):
        return tree[span[0] : span[1]]
    if isinstance(tree, dict):
        return {k: take(v, rank, span, ref_shards) for k, v in tree.items()}
    if isinstance(tree, tuple):
        return tuple(take(v, rank, span, ref_shards) for v in tree)
    return tree


def refs_in(tree: Any) -> list[Ref]:
    """Every Ref in a result (lists, tuples, dicts), to free on a failed dispatch."""
    if isinstance(tree, Ref):
        return [tree]
    if isinstance(tree, list | tuple):
        return [r for v in tree for r in refs_in(v)]
    if isinstance(tree, dict):
        return [r for v in tree.values() for r in refs_in(v)]
    return []


def concat(results: list) -> Any:
    """The per-rank results joined: arrays concatenated (numpy), tensors ``torch.cat``,
    lists chained, dicts and tuples joined per key/position, all-None gives None; other
    values (numbers, strings, Refs, objects) come back as a list, one per rank."""
    if all(r is None for r in results):
        return None
    first = results[0]
    kinds = {type(r) for r in results}
    if len(kinds) > 1:
        return list(results)
    if isinstance(first, list):
        return [x for r in results for x in r]
    if isinstance(first, dict):
        if any(set(r) != set(first) for r in results):
            return list(results)
        return {k: concat([r[k] for r in results]) for k in first}
    if isinstance(first, tuple):
        if any(len(r) != len(first) for r in results):
            return list(results)
        return tuple(concat([r[i] for r in results]) for i in range(len(first)))
    np = sys.modules.get("numpy")
    if np is not None and isinstance(first, np.ndarray) and first.ndim > 0:
        return np.concatenate(results)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(first, torch.Tensor) and first.dim() > 0:
        return torch.cat(results)
    return list(results)
