"""The rules of ``dispatch`` and of cross-role groups that need no process: the split
rule, what is split, how results join, the clean-up of a failed dispatch (with the
controller's ports played by coroutines), member ranks, and the nccl backend choice."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from corral import ConfigError, ProcessGroupError, WorkerFailedError, shards
from corral.controller import dispatch as D
from corral.groups import process_group
from corral.groups.controller import GroupPorts, GroupTable
from corral.groups.member import build, torch_backend
from corral.rpc.ref import PLANES, Ref


def test_uneven_splits_follow_numpy_array_split():
    for n in range(0, 23):
        for k in range(1, 9):
            got = [b - a for a, b in shards.bounds(n, k)]
            assert got == [len(x) for x in np.array_split(np.arange(n), k)], (n, k)
    assert shards.bounds(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]
    with pytest.raises(ConfigError):
        shards.bounds(3, 0)


def test_lists_arrays_tensors_split_inside_dicts_and_tuples_and_the_rest_goes_whole():
    batch = {"a": np.arange(5), "b": (torch.arange(5), "tag"), "c": list("abcde"), "n": 3}
    assert shards.row_count([batch], {"x": [1, 2, 3, 4, 5]}) == 5
    part = shards.take(batch, 1, (3, 5), lambda r: [])
    assert part["a"].tolist() == [3, 4] and part["b"][0].tolist() == [3, 4]
    assert part["b"][1] == "tag" and part["c"] == ["d", "e"] and part["n"] == 3
    assert shards.row_count([1, "x", None], {}) is None
    with pytest.raises(ConfigError, match=r"args\[0\]\['b'\]\[0\].*4 rows"):
        shards.row_count([{"a": np.arange(5), "b": (torch.arange(4),)}], {})
    assert shards.row_count([np.array(1.0), torch.tensor(2)], {}) is None  # 0-dim: whole


def test_a_ref_is_replaced_by_its_ranks_ref_and_counts_rows_from_its_shape():
    ref = Ref("a/0", "k" * 32, "float32", (7, 2), 56, "g", "x/y")
    assert shards.row_count([ref], {}) == 7
    parts = ["r0", "r1"]
    assert shards.take({"x": ref}, 1, (4, 7), lambda r: parts) == {"x": "r1"}


def test_concat_joins_by_kind():
    assert shards.concat([None, None]) is None
    assert shards.concat([[1], [2, 3]]) == [1, 2, 3]
    assert shards.concat([np.arange(2), np.arange(1)]).tolist() == [0, 1, 0]
    assert shards.concat([torch.ones(1), torch.zeros(2)]).tolist() == [1.0, 0.0, 0.0]
    joined = shards.concat([{"x": [1], "loss": 0.5}, {"x": [2], "loss": 0.25}])
    assert joined == {"x": [1, 2], "loss": [0.5, 0.25]}
    assert shards.concat([(1, [1]), (2, [2])]) == ([1, 2], [1, 2])
    assert shards.concat([1, "a"]) == [1, "a"]  # mixed kinds: one per rank


class _Plane:
    """Stands in for the controller's data plane: records frees."""

    def __init__(self):
        self.freed: list[str] = []

    def free(self, ref):
        self.freed.append(ref.key)

    def adopt(self, ref):
        pass


def _ref(key: str, rows: int = 4) -> Ref:
    return Ref("src/0", key, "float32", (rows,), rows * 4, "g", "unit/dispatch")


def test_a_failed_shard_frees_every_ref_made_for_the_dispatch_and_raises_the_dead_worker():
    plane = _Plane()
    PLANES["unit/dispatch"] = plane
    try:
        split_refs = [_ref(f"s{i}", 2) for i in range(3)]

        async def arequest(wid, path, payload):
            assert path == "/data/split" and payload["spans"] == [[0, 2], [2, 3], [3, 4]]
            return split_refs

        async def acall(wid, method, engine, args, kwargs, meta):
            assert meta["keep"] is True  # collect="refs"
            if wid == "t/1":
                raise WorkerFailedError("t/1", 3, "died")
            return {"out": _ref(f"out-{wid}")}

        ports = D.DispatchPorts(lambda role: ["t/0", "t/1", "t/2"], acall, arequest)
        with pytest.raises(WorkerFailedError, match="t/1"):
            asyncio.run(D.dispatch(ports, "t", "m", None, (_ref("batch"),), {}, collect="refs"))
        assert sorted(plane.freed) == ["out-t/0", "out-t/2", "s0", "s1", "s2"]
    finally:
        PLANES.pop("unit/dispatch", None)


def test_bad_modes_are_named():
    with pytest.raises(ConfigError, match="mode"):
        D.check("scatter", "concat", None)
    with pytest.raises(ConfigError, match="collect"):
        D.check("split", "sum", None)
    with pytest.raises(ConfigError, match="rpc_meta"):
        D.check("split", "list", [1])


def test_group_ranks_run_role_by_role_and_single_workers_can_be_named():
    roles = {"trainer": ["trainer/0", "trainer/1"], "rollout": ["rollout/0", "rollout/1"]}

    async def never(*a):
        raise AssertionError("no request expected")

    table = GroupTable(GroupPorts(lambda r: roles[r], never))
    assert table.members("w", ["trainer/0", "rollout"])[1] == ["trainer/0", "rollout/0",
                                                                 "rollout/1"]  # fmt: skip
    assert table.members("w", ["rollout", "trainer"])[1] == [
        "rollout/0", "rollout/1", "trainer/0", "trainer/1"
    ]  # fmt: skip
    with pytest.raises(ConfigError, match="trainer/5"):
        table.members("w", ["trainer/5"])
    with pytest.raises(ConfigError, match="name"):
        table.members("a/b", ["trainer"])
    with pytest.raises(ConfigError, match="backend"):
        asyncio.run(table.create("w", ["trainer"], backend="mpi"))
    with pytest.raises(ConfigError, match="timeout"):
        asyncio.run(table.create("w", ["trainer"], timeout=0))


def test_nccl_is_the_same_code_on_cuda_and_says_what_it_needs_without_it():
    assert torch_backend("gloo") == ("ProcessGroupGloo", "cpu")
    assert torch_backend("nccl") == ("ProcessGroupNCCL", "cuda")
    import torch.distributed as dist

    if not hasattr(dist, "ProcessGroupNCCL"):  # this CPU build: a clear error, no attempt
        with pytest.raises(ProcessGroupError, match='backend="nccl".*CUDA build'):
            build("nccl", None, 0, 2, 5.0, "127.0.0.1")
    with pytest.raises(ProcessGroupError, match="no process group named 'nope'.*create_process"):
        process_group("nope")


def test_the_chain_starts_at_the_source_and_cuts_tensors_into_byte_chunks():
    from corral.groups import chain

    assert chain.order(5, 0) == [0, 1, 2, 3, 4]
    assert chain.order(4, 2) == [2, 0, 1, 3]
    tensor = torch.arange(10, dtype=torch.float32)  # 40 bytes
    pieces = chain.chunks(tensor, 16)
    assert [p.numel() for p in pieces] == [16, 16, 8]
    pieces[2].zero_()  # views: writing a chunk writes the tensor
    assert tensor[-2:].tolist() == [0.0, 0.0] and tensor[7].item() == 7.0
