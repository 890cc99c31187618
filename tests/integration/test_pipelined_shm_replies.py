"""Pipelined calls whose reply travels in shared memory to a real peer process (the pipelining
logic in-process: tests/unit/test_pipelined_calls.py)."""

from __future__ import annotations

import asyncio

import pytest

from corral import BaseExperimentConfig, Job, LocalScheduler
from corral.errors import ProtocolError
from tests.unit.test_pipelined_calls import (
    ECHO,
    MiB,
    _call,
    _rid,
)


def test_delivery_of_a_reply_in_shared_memory_is_proven_by_an_ack_naming_it(tmp_path):
    """A real worker process (a segment is never mapped by the process that made it): once
    the ACK is in, the worker dropped the reply, so the same request id is refused."""
    cfg = BaseExperimentConfig(experiment_name="pipe", trial_name="t")
    sched = LocalScheduler(exp_config=cfg, fileroot=str(tmp_path), gpu_devices=[])
    try:
        (wid,) = sched.create_workers(Job(role="w", replicas=1))
        asyncio.run(sched.create_engine(wid, ECHO, "e"))
        worker = sched.get_workers("w")[0]
        client = sched.parts.caller.async_client
        rid = _rid()

        async def blob():
            return await client.request(
                worker.address, "/call", _call("blob", 2 * MiB, engine="e"), request_id=rid,
                identity=worker.identity, timeout=60,
            )  # fmt: skip

        async def twice():
            first = await blob()
            assert client.shm.local.get(worker.address), "the reply came in shared memory"
            await asyncio.sleep(0.5)  # the worker reads the ACK meanwhile
            with pytest.raises(ProtocolError, match="delivered already"):
                await blob()
            return first

        assert len(asyncio.run(twice())) == 2 * MiB
    finally:
        sched.close()
