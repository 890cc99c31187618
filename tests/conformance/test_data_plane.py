"""The data plane on every backend: refs, worker-to-worker transfer, shared memory, broadcast,
lifetimes and bad input. Each test ends with a leak check (refs, bytes and shared-memory
segments on every worker and in the controller). All workers of the test backends share
this host, so same-host transfers go through shared memory here."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import time

import numpy as np
import pytest

import corral
from corral import Job, SchedulingStrategy
from corral.errors import ConfigError
from corral.procs import pid_alive
from corral.rpc import shm

ECHO = "corral.testing.engines.EchoEngine"
DATA = "corral.testing.data_engines.DataEngine"
MiB = 1 << 20


def _workers(sched, role: str, n: int, engine: str = DATA) -> list[str]:
    ids = sched.create_workers(Job(role=role, replicas=n))
    for wid in ids:
        asyncio.run(sched.create_engine(wid, engine))
    return ids


def _stats(sched, wid: str) -> dict:
    return sched.parts.caller.call(sched.parts.table.worker(wid), "/data/stats", {"trim": True})


def assert_no_leaks(sched, *live: str) -> None:
    """After a scenario: no ref held anywhere, no segment lent or mapped by any worker that
    is still up, and none mapped by the controller once its idle pool is dropped."""
    gc.collect()
    sched.parts.data.flush()
    assert sched.parts.data._counts == {}, (
        f"controller still counts refs {sched.parts.data._counts}"
    )
    for wid in live:
        # Notes that a mapping is gone travel with the next request to the segment's owner
        # (workers send theirs within ~20 ms): wait for them, bounded.
        deadline = time.monotonic() + 10
        stats = _stats(sched, wid)
        while (
            stats["lent"] or stats["mapped"] or stats["relay_buffers"]
        ) and time.monotonic() < deadline:
            time.sleep(0.05)
            stats = _stats(sched, wid)
        assert stats["refs"] == 0 and stats["bytes"] == 0, f"{wid} still holds {stats}"
        assert stats["shared"] == 0 and stats["lent"] == 0, f"{wid} still holds {stats}"
        assert stats["relay_buffers"] == 0, f"{wid} still keeps relay buffers {stats}"
        assert stats["mapped"] == 0, f"{wid} still maps {stats['mapped']} segment(s)"
        assert stats["relay_sources"] == 0, f"{wid} still holds {stats}"
    assert _segments_gone_here(), f"the controller still maps segments: {_segments_here()}"


def test_keep_returns_refs_anywhere_in_a_nested_result(sched):
    (a,) = _workers(sched, "a", 1)
    res = sched.call_engine(a, "make", None, 4 * MiB, rpc_meta={"keep": True})
    ref, small = res["big"], res["nested"][0]["small"]
    assert isinstance(ref, corral.Ref) and isinstance(small, corral.Ref)
    assert (ref.owner, ref.dtype, ref.shape, ref.nbytes) == ("a/0", "float32", (MiB,), 4 * MiB)
    assert ref.generation == sched.get_workers("a")[0].generation
    assert res["count"] == 7  # not an array: stays a value
    expected = np.arange(MiB, dtype=np.float32)
    assert np.array_equal(ref.to_local(), expected)
    assert np.array_equal(asyncio.run(small.ato_local()), expected[:16])
    sized = sched.call_engine(a, "make", None, 4 * MiB, rpc_meta={"keep": MiB})
    assert isinstance(sized["big"], corral.Ref)
    assert isinstance(sized["nested"][0]["small"], np.ndarray)  # under the threshold
    del res, ref, small, sized
    assert_no_leaks(sched, a)


def test_engine_can_return_refs_on_purpose(sched):
    (a,) = _workers(sched, "a", 1)
    ref = sched.call_engine(a, "make_ref", None, 1024)
    assert isinstance(ref, corral.Ref)
    assert np.array_equal(ref.to_local(), np.ones(256, dtype=np.float32))
    del ref
    assert_no_leaks(sched, a)


def test_ref_passed_to_another_worker_is_fetched_from_the_owner(sched):
    a, b = _workers(sched, "a", 1) + _workers(sched, "b", 1)
    nbytes = 32 * MiB
    ref = sched.call_engine(a, "make", None, nbytes, rpc_meta={"keep": True})["big"]
    before = (
        sched.parts.caller.client.bytes_received + sched.parts.caller.async_client.bytes_received
    )
    got = sched.call_engine(b, "describe", None, {"weights": [ref]})
    read = (
        sched.parts.caller.client.bytes_received
        + sched.parts.caller.async_client.bytes_received
        - before
    )
    assert got == {"type": "ndarray", "nbytes": nbytes, "first": 0.0, "last": nbytes / 4 - 1}
    assert read < nbytes / 100, f"the controller read {read} bytes of a {nbytes}-byte transfer"
    assert sched.call_engine(b, "describe", None, ref, rpc_meta={"keep": True})["nbytes"] == nbytes
    del ref
    assert_no_leaks(sched, a, b)


def test_a_ref_in_create_engine_arguments_reaches_the_constructor(sched):
    (a,) = _workers(sched, "a", 1)
    (b,) = sched.create_workers(Job(role="b", replicas=1))
    ref = sched.call_engine(a, "make", None, 4 * MiB, rpc_meta={"keep": True})["big"]
    asyncio.run(sched.create_engine(b, DATA, None, ref))
    assert sched.call_engine(b, "held_nbytes") == 4 * MiB
    del ref
    sched.call_engine(b, "destroy_held")
    assert_no_leaks(sched, a, b)


def controller_shares_the_workers_host(backend) -> bool:
    """Local and Ray workers run on the controller's host. The Slurm lab's nodes are hosts
    of their own (own host names, UTS namespaces): the controller reaches them over TCP."""
    return backend.name != "slurm"


def test_calls_go_through_shared_memory_exactly_on_the_same_host(sched, backend):
    (a,) = _workers(sched, "a", 1)
    value = np.arange(4 * MiB, dtype=np.float32)
    sched.call_engine(a, "echo", None, np.zeros(4))  # learns whether the worker is local
    back = sched.call_engine(a, "echo", None, value)
    assert np.array_equal(back, value)
    if not controller_shares_the_workers_host(backend):  # another host: the socket
        assert not shm.in_segment(back)
        assert not sched.call_engine(a, "in_shared_memory", None, value)
        del back
        assert_no_leaks(sched, a)
        return
    assert shm.in_segment(back)  # the reply is a view of the worker's segment
    assert sched.call_engine(a, "in_shared_memory", None, value)  # and the argument of ours
    assert not shm.in_segment(value)
    back[0] = -1.0  # private copy-on-write mapping: writable, and only ours
    assert sched.call_engine(a, "echo", None, value)[0] == 0.0
    del back
    assert_no_leaks(sched, a)


def test_refs_owned_by_forked_workers(sched):
    (a,) = _workers(sched, "a", 1)
    (f,) = sched.create_workers(
        Job(role="f", replicas=1, scheduling_strategy=SchedulingStrategy("colocation", "a", True))
    )
    asyncio.run(sched.create_engine(f, DATA))
    ref = sched.call_engine(f, "make", None, 8 * MiB, rpc_meta={"keep": True})["big"]
    assert ref.owner == "f/0"
    assert sched.call_engine(a, "describe", None, ref)["nbytes"] == 8 * MiB
    assert sched.call_engine(a, "in_shared_memory", None, ref)  # a fork shares the host
    assert np.array_equal(ref.to_local(), np.arange(2 * MiB, dtype=np.float32))
    del ref
    assert_no_leaks(sched, a, f)
    sched.delete_workers("f")


def test_broadcast_of_one_ref_is_served_from_one_copy(sched):
    (owner,) = _workers(sched, "owner", 1)
    readers = _workers(sched, "readers", 4)
    ref = sched.call_engine(owner, "make", None, 16 * MiB, rpc_meta={"keep": True})["big"]

    async def all_read(r):
        return await asyncio.gather(
            *(sched.async_call_engine(w, "describe", None, r) for w in readers)
        )

    got = asyncio.run(all_read(ref))
    assert all(g["nbytes"] == 16 * MiB and g["last"] == 4 * MiB - 1 for g in got)
    assert _stats(sched, owner)["shared"] == 1  # one shared copy served every reader
    del ref
    assert_no_leaks(sched, owner, *readers)


def test_dropped_and_freed_refs_are_released_on_the_owner(sched):
    (a,) = _workers(sched, "a", 1)
    res = sched.call_engine(a, "make", None, 4 * MiB, rpc_meta={"keep": True})
    assert _stats(sched, a)["refs"] == 2
    kept = res["big"]
    del res  # drops the small ref; the big one is still held by `kept`
    gc.collect()
    sched.parts.data.flush()
    assert _stats(sched, a)["refs"] == 1
    kept.free()
    sched.parts.data.flush()
    assert _stats(sched, a)["refs"] == 0
    with pytest.raises(corral.RefError, match="freed"):
        kept.to_local()
    with pytest.raises(corral.RefError, match="freed"):
        sched.call_engine(a, "describe", None, kept)
    del kept
    assert_no_leaks(sched, a)


def test_deleting_a_role_frees_its_refs(sched):
    a, b = _workers(sched, "a", 1) + _workers(sched, "b", 1)
    pid = sched.get_workers("a")[0].pid
    ref = sched.call_engine(a, "make", None, 1024, rpc_meta={"keep": True})["big"]
    sched.delete_workers("a")
    with pytest.raises(corral.RefLostError, match=r"a/0 was deleted with delete_workers\('a'\)"):
        ref.to_local()
    with pytest.raises(corral.RefLostError, match="a/0 is no longer registered") as passed:
        sched.call_engine(b, "describe", None, ref)
    assert passed.value.owner == "a/0"
    del passed
    deadline = time.monotonic() + 10
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    del ref
    assert_no_leaks(sched, b)


def test_ref_of_a_dead_owner_raises_ref_lost_naming_it(sched, backend):
    a, b = _workers(sched, "a", 1) + _workers(sched, "b", 1)
    ref = sched.call_engine(a, "make", None, 1024, rpc_meta={"keep": True})["big"]
    backend.kill_worker(sched.get_workers("a")[0], signal.SIGKILL)
    with pytest.raises(corral.RefLostError) as passed:
        sched.call_engine(b, "describe", None, ref)
    assert passed.value.owner == "a/0" and "a/0" in str(passed.value)
    with pytest.raises(corral.RefLostError) as fetched:
        ref.to_local()
    assert fetched.value.owner == "a/0" and "died" in str(fetched.value)
    del ref, passed, fetched  # the tracebacks hold the ref too
    assert_no_leaks(sched, b)


def test_bad_refs_give_clear_errors(sched):
    a, b = _workers(sched, "a", 1) + _workers(sched, "b", 1)
    real = sched.call_engine(a, "make", None, 1024, rpc_meta={"keep": True})["big"]
    forged = corral.Ref("a/0", "0" * 32, "float32", (4,), 16, real.generation, real.trial)
    with pytest.raises(corral.RefError, match="holds no ref with key"):
        forged.to_local()
    with pytest.raises(corral.RefError, match="holds no ref with key"):
        sched.call_engine(b, "describe", None, forged)
    stranger = corral.Ref("a/0", real.key, "float32", (4,), 16, real.generation, "x/other")
    with pytest.raises(corral.RefError, match="refs cannot cross trials"):
        sched.call_engine(b, "describe", None, stranger)
    with pytest.raises(corral.RefError, match="no open scheduler"):
        stranger.to_local()
    nobody = corral.Ref("zz/9", real.key, "float32", (4,), 16, real.generation, real.trial)
    with pytest.raises(corral.RefError, match="no worker of this trial"):
        nobody.to_local()
    with pytest.raises(ConfigError, match=r"rpc_meta\['keep'\]='yes'"):
        sched.call_engine(a, "make", None, 1024, rpc_meta={"keep": "yes"})
    assert sched.call_engine(a, "describe", None, real)["nbytes"] == 1024  # all still fine
    del real, forged, stranger, nobody
    assert_no_leaks(sched, a, b)


def test_no_segment_survives_sigkill_of_either_side(sched, backend):
    if not controller_shares_the_workers_host(backend):
        _no_segment_survives_sigkill_between_workers(sched, backend)
        return
    (a,) = _workers(sched, "a", 1)
    value = np.ones(4 * MiB, dtype=np.float32)
    sched.call_engine(a, "echo", None, np.zeros(4))
    back = sched.call_engine(a, "echo", None, value)  # the worker lent us a segment
    worker = sched.get_workers("a")[0]
    assert shm.mapped_segments(worker.pid) >= 1
    backend.kill_worker(worker, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while pid_alive(worker.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    # the pool frees a segment lent to a reader once that reader is dead: say so if the
    # owner is still running, rather than count its segment as a leak below
    assert not pid_alive(worker.pid), f"worker pid {worker.pid} still runs 30 s after SIGKILL"
    assert float(back.sum()) == 4 * MiB  # our mapping outlives the owner...
    del back
    assert _segments_gone_here(), _segments_here()  # ...and goes with it
    assert not [n for n in os.listdir("/dev/shm") if n.startswith("corral")]  # no names


def _segments_gone_here(timeout: float = 10.0) -> bool:
    """Drop our idle and dead readers' segments until this process maps or holds none
    (bounded: a reference that outlives the call, e.g. in another thread, goes soon)."""
    deadline = time.monotonic() + timeout
    while True:
        gc.collect()
        shm.POOL.trim()
        if shm.mapped_segments() == 0 or time.monotonic() > deadline:
            return shm.mapped_segments() == 0
        time.sleep(0.05)


def _segments_here() -> str:
    """What this process still maps or holds of corral segments, and the pool's view."""
    with open("/proc/self/maps") as fh:
        maps = [line.split()[-2] for line in fh if "/memfd:corral-" in line]
    fds = []
    for entry in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{entry}")
        except OSError:
            continue
        if target.startswith("/memfd:corral-"):
            fds.append(target)
    busy = {name: sorted(seg.readers) for name, seg in shm.POOL.busy.items()}
    return f"mapped {maps}, open fds {fds}, pool {shm.POOL.counts()} lent to pids {busy}"


def _no_segment_survives_sigkill_between_workers(sched, backend) -> None:
    """The same between a worker and its fork (one node), where the controller is on
    another host: the parent maps the fork's segment, the fork is SIGKILLed."""
    (a,) = _workers(sched, "a", 1)
    (f,) = sched.create_workers(
        Job(role="f", replicas=1, scheduling_strategy=SchedulingStrategy("colocation", "a", True))
    )
    asyncio.run(sched.create_engine(f, DATA))
    ref = sched.call_engine(f, "make", None, 8 * MiB, rpc_meta={"keep": True})["big"]
    assert sched.call_engine(a, "hold", None, ref)  # a keeps a view of f's segment
    assert sched.call_engine(a, "segments_mapped", None, None) >= 1
    fork = sched.get_workers("f")[0]
    backend.kill_worker(fork, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while pid_alive(fork.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    expected = float(np.arange(2 * MiB, dtype=np.float32).sum())
    assert sched.call_engine(a, "held_sum") == expected  # the mapping outlives its owner...
    sched.call_engine(a, "destroy_held")
    assert sched.call_engine(a, "segments_mapped", None, None) == 0  # ...and goes with it
    del ref
    sched.delete_workers("f")
    assert not [n for n in os.listdir("/dev/shm") if n.startswith("corral")]
    assert_no_leaks(sched, a)
