"""A broadcast across the Slurm lab's nodes is relayed: the owner sends about one copy.

The lab's nodes share one kernel but each has its own host name (UTS namespace), so
corral treats them as the distinct hosts they stand for: transfers between nodes take
the TCP path (no shared memory), as on a real cluster."""

from __future__ import annotations

import asyncio

import pytest

from corral import Job, SchedulingSpec
from tests.conformance.test_data_plane import DATA, MiB, _stats, assert_no_leaks
from tests.slurm.test_slurm_backend import lab, make  # noqa: F401 (fixtures)


@pytest.mark.slurm
def test_broadcast_to_readers_on_four_nodes_costs_the_owner_one_copy(make, lab):  # noqa: F811
    if lab < 4:
        pytest.skip("needs lab nodes with >= 4 GPUs")
    sched = make()
    # each reader takes every GPU of a node: no two readers share a node; the owner (no
    # GPU) shares one of them
    (owner,) = sched.create_workers(Job(role="owner", replicas=1))
    readers = sched.create_workers(Job(role="readers", replicas=4, tasks=[SchedulingSpec(gpu=lab)]))
    for wid in [owner, *readers]:
        asyncio.run(sched.create_engine(wid, DATA))
    owner_host = sched.get_workers("owner")[0].host
    hosts = [w.host for w in sched.get_workers("readers")]
    assert len(set(hosts)) == 4, f"readers are not on 4 nodes: {hosts}"
    remote = sum(h != owner_host for h in hosts)
    assert remote == 3  # one reader shares the owner's node (shared memory), three do not

    size = 64 * MiB
    ref = sched.call_engine(owner, "make", None, size, rpc_meta={"keep": True})["big"]
    expected = sched.call_engine(owner, "digest", None, ref)

    async def read_all(r):
        return await asyncio.gather(
            *(sched.async_call_engine(w, "digest", None, r) for w in readers)
        )

    assert asyncio.run(read_all(ref)) == [expected] * 4  # identical bytes on every node
    assert [_stats(sched, r)["relay_fallbacks"] for r in readers] == [0] * 4
    owner_stats = _stats(sched, owner)
    # over TCP (served_bytes counts no shared memory) the owner sent one copy plus a
    # frame header, not one per remote reader
    assert size <= owner_stats["served_bytes"] < size + MiB, owner_stats
    relayed = sum(_stats(sched, r)["relayed_bytes"] for r in readers)
    assert relayed >= (remote - 1) * size, "the other remote readers got it from a reader"
    # the reader on the owner's node mapped the owner's shared copy instead
    assert owner_stats["shared"] == 1, owner_stats
    del ref
    assert_no_leaks(sched, owner, *readers)
