"""A data-parallel head's call arguments reach every rank of its group (AReaL's
``rpc_meta["broadcast"]``), over real torch.distributed (gloo on the CPU).

The workers of one role form a process group; blocks of two ranks are one model replica,
the first rank of each its head (tests/support/dp_engine.py, AReaL's TrainEngine
interface). As AReaL's TrainController does, a call's data goes to the heads only and the
other ranks get an empty call (areal/infra/controller/train_controller.py:561-591).
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from corral import ConfigError, EngineCallError, Job, SchedulingSpec
from corral.errors import ProtocolError

DP = "tests.support.dp_engine.DPGroupEngine"
ECHO = "corral.testing.engines.EchoEngine"
NO_HANG = 120.0  # a missing partner in a collective fails the test instead of hanging it


def _gather(sched, calls):
    async def run():
        return await asyncio.gather(
            *(
                sched.async_call_engine(wid, method, "dp", *args, http_timeout=NO_HANG, **kw)
                for wid, method, args, kw in calls
            )
        )

    return asyncio.run(run())


def _group(sched, replicas: int, group_size: int) -> list[str]:
    """``replicas`` workers in one gloo group, ``group_size`` ranks per replica, initialized."""
    spec = SchedulingSpec(cpu=1, mem=1, gpu=0)
    ids = sched.create_workers(Job(role="dp", replicas=replicas, tasks=[spec]))
    for wid in ids:
        asyncio.run(sched.create_engine(wid, DP, "dp"))
    _gather(sched, [(w, "create_process_group", (), {"group_size": group_size}) for w in ids])
    _gather(sched, [(w, "initialize", (), {}) for w in ids])  # not initialized yet: no broadcast
    assert _gather(sched, [(w, "is_data_parallel_head", (), {}) for w in ids]) == [
        rank % group_size == 0 for rank in range(replicas)
    ]
    return ids


def _batch(seed: int) -> dict:
    return {
        "input_ids": torch.arange(6, dtype=torch.int64).reshape(2, 3) + seed,
        "mask": torch.tensor([[True, False, True]]),
        "nested": [torch.full((2,), float(seed), dtype=torch.bfloat16), ("text", seed)],
    }


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return (
            isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(a, b)
        )
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return a == b


def test_non_heads_get_their_heads_tensors_by_default_once_initialized(sched):
    ids = _group(sched, replicas=4, group_size=2)  # replicas (0, 1) and (2, 3)
    batches = {0: _batch(10), 2: _batch(20)}
    calls = [
        (wid, "received", (batches[r],), {"step": r}) if r in batches else (wid, "received", (), {})
        for r, wid in enumerate(ids)
    ]
    got = _gather(sched, calls)  # rpc_meta left out: AReaL's default for an initialized engine

    for rank, call in enumerate(got):
        head = rank - rank % 2
        assert call["rank"] == rank
        assert _same(call["args"], [batches[head]]), (rank, call["args"])
        assert call["kwargs"] == {"step": head}


def test_broadcast_false_calls_each_rank_with_what_it_was_sent(sched):
    ids = _group(sched, replicas=2, group_size=2)
    batch = _batch(5)
    off = {"rpc_meta": {"broadcast": False}}
    head, other = _gather(
        sched, [(ids[0], "received", (batch,), off), (ids[1], "received", (), off)]
    )
    assert _same(head["args"], [batch])
    assert other["args"] == [] and other["kwargs"] == {}
    # no collective either: one rank alone is answered (a broadcast would wait for its head)
    alone = sched.call_engine(
        ids[1], "received", "dp", "own", rpc_meta={"broadcast": False}, http_timeout=NO_HANG
    )
    assert alone["args"] == ["own"]


def test_a_bad_broadcast_flag_is_refused_before_anything_is_sent(sched):
    (wid,) = sched.create_workers(Job(role="e", replicas=1, tasks=[SchedulingSpec(cpu=1)]))
    asyncio.run(sched.create_engine(wid, ECHO, "e"))
    with pytest.raises(ConfigError, match=r"rpc_meta\['broadcast'\]='yes'.*True"):
        sched.call_engine(wid, "echo", "e", 1, rpc_meta={"broadcast": "yes"})
    assert sched.call_engine(wid, "count", "e") == 0  # the echo never ran
    # a raw request with a bad flag is refused by the worker too
    raw = {"engine_name": "e", "method": "echo", "args": [1], "kwargs": {}, "broadcast": 1}
    with pytest.raises(ProtocolError, match=r"rpc_meta\['broadcast'\]=1"):
        sched.parts.caller.call(sched.parts.table.worker(wid), "/call", raw)
    assert sched.call_engine(wid, "count", "e") == 0


def test_an_engine_without_the_interface_is_not_broadcast_and_loads_no_torch(sched):
    (wid,) = sched.create_workers(Job(role="e", replicas=1, tasks=[SchedulingSpec(cpu=1)]))
    asyncio.run(sched.create_engine(wid, ECHO, "e"))
    assert sched.call_engine(wid, "echo", "e", [1, 2]) == [1, 2]
    assert sched.call_engine(wid, "loaded", "e", ["torch"]) == []
    with pytest.raises(EngineCallError, match="no current_data_parallel_head, context_and_model"):
        sched.call_engine(wid, "echo", "e", 1, rpc_meta={"broadcast": True})
    assert sched.call_engine(wid, "loaded", "e", ["torch"]) == []
