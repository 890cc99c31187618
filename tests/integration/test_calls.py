"""One call path for sync and async calls (corral.controller.caller), on real local workers."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from corral import BaseExperimentConfig, Job, LocalScheduler, WorkerFailedError

ECHO = "corral.testing.engines.EchoEngine"


@pytest.fixture
def local_sched(tmp_path):
    cfg = BaseExperimentConfig(experiment_name="calls", trial_name="t")
    s = LocalScheduler(exp_config=cfg, fileroot=str(tmp_path), gpu_devices=[], startup_timeout=60)
    yield s
    s.close()


def _one_worker(local_sched):
    (wid,) = local_sched.create_workers(Job(role="w", replicas=1))
    asyncio.run(local_sched.create_engine(wid, ECHO, "e"))
    return wid, local_sched.get_workers("w")[0]


async def _concurrently(local_sched, wid, n):
    return await asyncio.gather(
        *(local_sched.async_call_engine(wid, "echo", "e", i) for i in range(n))
    )


def test_async_path_drops_pooled_connections_of_a_dead_worker(local_sched):
    wid, worker = _one_worker(local_sched)
    loop = asyncio.new_event_loop()
    try:
        assert loop.run_until_complete(_concurrently(local_sched, wid, 3)) == [0, 1, 2]
        pool = local_sched.parts.caller.async_client._pools[loop][worker.address]
        # small engine calls share one pipelined connection (corral.rpc.pipeline)
        assert pool.pipe is not None and pool.pipe.closed is None, "the calls left it open"
        pipe = pool.pipe
        os.kill(worker.pid, signal.SIGKILL)
        with pytest.raises(WorkerFailedError):
            loop.run_until_complete(local_sched.async_call_engine(wid, "echo", "e", 1))
        left = local_sched.parts.caller.async_client._pools[loop].get(worker.address)
        assert left is None or (left.idle == [] and left.pipe is None)
        assert pipe.transport.is_closing()
    finally:
        loop.close()


def test_sync_and_async_calls_share_one_policy(local_sched, monkeypatch):
    wid, worker = _one_worker(local_sched)
    seen = []
    settle = local_sched.parts.caller.settle

    def spy(*args):
        seen.append(args[1])
        return settle(*args)

    monkeypatch.setattr(local_sched.parts.caller, "settle", spy)
    os.kill(worker.pid, signal.SIGKILL)
    with pytest.raises(WorkerFailedError):
        local_sched.call_engine(wid, "echo", "e", 1)
    with pytest.raises(WorkerFailedError):
        asyncio.run(local_sched.async_call_engine(wid, "echo", "e", 1))
    assert seen == ["/call", "/call"]


def test_close_closes_the_async_clients_connections(local_sched):
    wid, _ = _one_worker(local_sched)
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(_concurrently(local_sched, wid, 2))
        loop.run_until_complete(local_sched.async_call_engine(wid, "echo", "e", b"x" * 100_000))
        pools = local_sched.parts.caller.async_client._pools[loop].values()
        # a large call took a connection of its own; the small ones shared the pipelined one
        transports = [w.transport for pool in pools for _, w in pool.idle]
        transports += [pool.pipe.transport for pool in pools if pool.pipe is not None]
        assert len(transports) == 2 and not any(t.is_closing() for t in transports)
        local_sched.close()
        loop.run_until_complete(asyncio.sleep(0.01))  # the loop runs the closes it was handed
        assert all(t.is_closing() for t in transports)
    finally:
        loop.close()
