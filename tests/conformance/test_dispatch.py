"""``dispatch`` / ``async_dispatch`` over a role on every backend: each worker gets only
its rows, results come back in rank order, a batch held by a worker never visits the
controller, a dead shard's worker is named and nothing is left behind."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from corral import ConfigError, Job, SchedulingSpec, WorkerFailedError
from tests.conformance.test_data_plane import assert_no_leaks

SHARD = "corral.testing.verb_engines.ShardEngine"
DP = "tests.support.dp_engine.DPGroupEngine"
MiB = 1 << 20


def _role(sched, role: str, n: int, engine: str = SHARD) -> list[str]:
    spec = SchedulingSpec(cpu=1, mem=1, gpu=0)
    ids = sched.create_workers(Job(role=role, replicas=n, tasks=[spec]))
    for wid in ids:
        asyncio.run(sched.create_engine(wid, engine, None, wid))
    return ids


def test_split_sends_each_rank_only_its_rows_and_concats_in_rank_order(sched):
    ids = _role(sched, "t", 4)
    batch = {
        "ids": np.arange(10 * 3, dtype=np.int64).reshape(10, 3),
        "mask": torch.arange(10) % 2 == 0,
        "texts": [f"s{i}" for i in range(10)],
    }
    seen = sched.dispatch("t", "shapes", None, batch, step=7, collect="list")
    # numpy's array_split rule: 10 rows over 4 ranks -> 3, 3, 2, 2, in rank order
    assert [s["worker"] for s in seen] == ids
    for got, rows in zip(seen, [3, 3, 2, 2], strict=True):
        assert got["args"][0]["ids"] == ["ndarray", [rows, 3], rows * 3 * 8]
        assert got["args"][0]["mask"] == ["tensor", [rows], rows]
        assert got["args"][0]["texts"] == ["list", rows]
        assert got["kwargs"] == {"step": ["value", 7]}  # not split: whole to every rank
    back = sched.dispatch("t", "echo", None, batch)
    assert np.array_equal(back["ids"], batch["ids"])
    assert torch.equal(back["mask"], batch["mask"]) and back["texts"] == batch["texts"]
    # fewer rows than ranks: the last ranks get empty shards and are still called
    assert sched.dispatch("t", "rows", None, [1, 2], collect="list") == [1, 1, 0, 0]


def test_async_dispatch_and_the_other_modes(sched):
    ids = _role(sched, "t", 3)

    async def run():
        doubled = await sched.async_dispatch("t", "double", None, np.arange(7))
        every = await sched.async_dispatch("t", "whoami", None, mode="all", collect="list")
        first = await sched.async_dispatch("t", "shapes", None, np.arange(7), mode="rank0")
        whole = await sched.async_dispatch("t", "rows", None, [0] * 5, mode="all", collect="list")
        return doubled, every, first, whole

    doubled, every, first, whole = asyncio.run(run())
    assert np.array_equal(doubled, np.arange(7) * 2)
    assert every == ids
    assert first["worker"] == ids[0] and first["args"] == [["ndarray", [7], 56]]
    assert whole == [5, 5, 5]
    assert sched.dispatch("t", "whoami", None, mode="rank0") == ids[0]


def test_a_ref_batch_is_split_on_its_owner_and_the_controller_never_holds_it(sched):
    (owner,) = _role(sched, "src", 1)
    ids = _role(sched, "t", 4)
    rows, cols = 1030, 1024  # ~4 MiB of float32, 1030 rows over 4 ranks: 258, 258, 257, 257

    def received():
        return (
            sched.parts.caller.client.bytes_received
            + sched.parts.caller.async_client.bytes_received
        )  # noqa: E731

    before = received()
    batch = sched.call_engine(owner, "batch", None, rows, cols, rpc_meta={"keep": True})
    seen = sched.dispatch("t", "shapes", None, {"x": batch}, collect="list")
    kept = sched.dispatch("t", "double", None, batch, collect="refs")
    got = received() - before
    assert got < 0.01 * batch.nbytes, f"the controller received {got} B of {batch.nbytes}"
    for s, n in zip(seen, [258, 258, 257, 257], strict=True):
        assert s["args"][0]["x"] == ["ndarray", [n, cols], n * cols * 4]  # its rows only
    # collect="refs": the results stay on the workers, in rank order
    assert [r.owner for r in kept] == ids and [r.shape[0] for r in kept] == [258, 258, 257, 257]
    expected = np.arange(rows * cols, dtype=np.float32).reshape(rows, cols) * 2
    assert np.array_equal(np.concatenate([r.to_local() for r in kept]), expected)
    del batch, kept
    assert_no_leaks(sched, owner, *ids)  # the per-rank refs of the split are gone too


def test_a_dead_shard_names_its_worker_and_leaves_no_refs(sched):
    (owner,) = _role(sched, "src", 1)
    ids = _role(sched, "t", 3)
    batch = sched.call_engine(owner, "batch", None, 9, 4, rpc_meta={"keep": True})
    with pytest.raises(WorkerFailedError, match="t/1") as info:
        sched.dispatch("t", "die_on", None, ids[1], batch, collect="refs")
    assert "t/1" in str(info.value)
    del batch, info  # the traceback's frames hold the call's arguments
    # the survivors' kept results and the owner's per-rank refs were freed. On Slurm a
    # task's bad exit ends its role's step (--kill-on-bad-exit=1 without max_restarts), so
    # there the survivors are gone too; the owner (a job of its own) is checked everywhere.
    survivors = [] if sched.backend == "slurm" else [ids[0], ids[2]]
    assert_no_leaks(sched, owner, *survivors)


def test_engine_mode_follows_the_engines_data_parallel_layout(sched):
    spec = SchedulingSpec(cpu=1, mem=1, gpu=0)
    ids = sched.create_workers(Job(role="dp", replicas=4, tasks=[spec]))
    for wid in ids:
        asyncio.run(sched.create_engine(wid, DP, "dp"))
    sched.dispatch("dp", "create_process_group", "dp", mode="all", group_size=2)
    sched.dispatch("dp", "initialize", "dp", mode="all")
    batch = torch.arange(5 * 2).reshape(5, 2)  # 2 DP ranks (heads dp/0, dp/2): 3 and 2 rows
    got = sched.dispatch("dp", "received", "dp", batch, mode="engine", collect="list")
    assert [g["rank"] for g in got] == [0, 2]  # the heads' results, in DP rank order
    assert torch.equal(got[0]["args"][0], batch[:3]) and torch.equal(got[1]["args"][0], batch[3:])
    histories = sched.dispatch("dp", "history", "dp", mode="all", collect="list")
    # the non-heads took their head's rows by torch.distributed broadcast
    assert torch.equal(histories[1][-1]["args"][0], batch[:3])
    assert torch.equal(histories[3][-1]["args"][0], batch[3:])


def test_bad_dispatch_input_is_refused_before_anything_is_sent(sched):
    _role(sched, "t", 2)
    with pytest.raises(ConfigError, match="mode.*'split'"):
        sched.dispatch("t", "echo", None, [1], mode="scatter")
    with pytest.raises(ConfigError, match="collect"):
        sched.dispatch("t", "echo", None, [1], collect="sum")
    with pytest.raises(ConfigError, match=r"kwargs\['b'\].*3 rows.*args\[0\] has 2"):
        sched.dispatch("t", "shapes", None, [1, 2], b=[1, 2, 3])
    assert sched.dispatch("t", "calls", None, mode="all", collect="list") == [0, 0]
