"""Cross-host broadcast relay (docs/data-plane.md, "Broadcast"), on every backend.

All workers of the test backends run on this one machine, so these tests are a
**stand-in** for other hosts: readers and owner run with ``CORRAL_SHM=0``, which turns
off same-host detection (no shared memory), so every fetch takes the TCP path a remote
reader takes. The same test on real distinct hosts (the Slurm lab's nodes, each its own
UTS namespace) is tests/slurm/test_relay_across_nodes.py.
"""

from __future__ import annotations

import asyncio
import signal

from corral import Job, SchedulingSpec
from tests.conformance.test_data_plane import DATA, MiB, _stats, assert_no_leaks

NO_SHM = {"CORRAL_SHM": "0"}


def _tcp_workers(sched, role: str, n: int, env: dict | None = None) -> list[str]:
    spec = SchedulingSpec(env_vars={**NO_SHM, **(env or {})})
    ids = sched.create_workers(Job(role=role, replicas=n, tasks=[spec]))
    for wid in ids:
        asyncio.run(sched.create_engine(wid, DATA))
    return ids


def _read_all(sched, readers: list[str], ref) -> list[str]:
    async def go():
        return await asyncio.gather(
            *(sched.async_call_engine(w, "digest", None, ref) for w in readers)
        )

    return asyncio.run(go())


def test_broadcast_relay_standin_shm_off_owner_sends_one_copy(sched):
    (owner,) = _tcp_workers(sched, "owner", 1)
    readers = _tcp_workers(sched, "readers", 4)
    size = 32 * MiB
    ref = sched.call_engine(owner, "make", None, size, rpc_meta={"keep": True})["big"]
    expected = sched.call_engine(owner, "digest", None, ref)  # the owner uses it in place
    assert _read_all(sched, readers, ref) == [expected] * 4  # identical bytes everywhere
    owner_stats = _stats(sched, owner)
    assert [_stats(sched, r)["relay_fallbacks"] for r in readers] == [0] * 4
    # the frame is the array plus a few hundred bytes: one copy, not four
    assert size <= owner_stats["served_bytes"] < size + MiB, owner_stats
    relayed = sum(_stats(sched, r)["relayed_bytes"] for r in readers)
    assert relayed >= 3 * size, "three readers must have got the bytes from another reader"
    assert owner_stats["relay_sources"] == 1
    del ref
    assert_no_leaks(sched, owner, *readers)


def test_relay_falls_back_to_the_owner_when_the_upstream_died_standin(sched, backend):
    (owner,) = _tcp_workers(sched, "owner", 1)
    # two roles: on Slurm one role is one job, and a task's death ends the job's others
    (first,) = _tcp_workers(sched, "first", 1)
    (second,) = _tcp_workers(sched, "second", 1)
    size = 16 * MiB
    ref = sched.call_engine(owner, "make", None, size, rpc_meta={"keep": True})["big"]
    expected = sched.call_engine(owner, "digest", None, ref)
    assert sched.call_engine(first, "digest", None, ref) == expected
    # the owner names `first` as the next reader's upstream; it dies before serving it
    backend.kill_worker(sched.get_workers("first")[0], signal.SIGKILL)
    assert sched.call_engine(second, "digest", None, ref) == expected
    stats = _stats(sched, second)
    assert stats["relay_fallbacks"] == 1, stats
    assert size * 2 <= _stats(sched, owner)["served_bytes"] < 2 * size + MiB
    del ref
    assert_no_leaks(sched, owner, second)


def test_a_frozen_upstream_does_not_hang_its_reader_standin(sched, backend):
    """The upstream is stopped (SIGSTOP): its connection is accepted but never answered.
    The reader gives up on it after its upstream timeout (2 x 2 s + 5 s here) and pulls
    from the owner."""
    fast = {"CORRAL_RELAY_WAIT": "2"}
    (owner,) = _tcp_workers(sched, "owner", 1, fast)
    (first,) = _tcp_workers(sched, "first", 1, fast)
    (second,) = _tcp_workers(sched, "second", 1, fast)
    size = 16 * MiB
    ref = sched.call_engine(owner, "make", None, size, rpc_meta={"keep": True})["big"]
    expected = sched.call_engine(owner, "digest", None, ref)
    assert sched.call_engine(first, "digest", None, ref) == expected
    frozen = sched.get_workers("first")[0]
    backend.kill_worker(frozen, signal.SIGSTOP)
    try:
        assert sched.call_engine(second, "digest", None, ref, http_timeout=60) == expected
    finally:
        backend.kill_worker(frozen, signal.SIGCONT)
    assert _stats(sched, second)["relay_fallbacks"] == 1
    del ref
    assert_no_leaks(sched, owner, first, second)


def test_small_refs_are_not_relayed_standin(sched):
    (owner,) = _tcp_workers(sched, "owner", 1)
    (reader,) = _tcp_workers(sched, "readers", 1)
    ref = sched.call_engine(owner, "make", None, MiB, rpc_meta={"keep": True})["big"]
    assert sched.call_engine(reader, "digest", None, ref) == sched.call_engine(
        owner, "digest", None, ref
    )
    stats = _stats(sched, owner)
    assert stats["relay_sources"] == 0 and MiB <= stats["served_bytes"] < 2 * MiB
    del ref
    assert_no_leaks(sched, owner, reader)
