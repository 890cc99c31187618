"""``async_call_engine`` inside a running loop: the call leaves at once and what comes back
is its future (corral.controller.pending_call), on a real local worker."""

from __future__ import annotations

import asyncio

import pytest

from corral import BaseExperimentConfig, ConfigError, Job, LocalScheduler
from corral.controller.pending_call import PendingCall
from corral.errors import EngineCallError, WorkerNotFoundError

ECHO = "corral.testing.engines.EchoEngine"


@pytest.fixture(scope="module")
def local_sched(tmp_path_factory):
    cfg = BaseExperimentConfig(experiment_name="pending", trial_name="t")
    root = str(tmp_path_factory.mktemp("pending"))
    s = LocalScheduler(exp_config=cfg, fileroot=root, gpu_devices=[], startup_timeout=60)
    (wid,) = s.create_workers(Job(role="w", replicas=1))
    asyncio.run(s.create_engine(wid, ECHO, "e"))
    yield s
    s.close()


async def _framed(local_sched) -> None:
    """The first calls open the worker's connection and see a reply frame."""
    assert await asyncio.gather(
        *(local_sched.async_call_engine("w/0", "echo", "e", i) for i in (1, 2))
    )


def _totals(local_sched) -> tuple[int, int]:
    figures = local_sched.parts.caller.stats.sample_all().workers["w/0"]
    return figures["total"], figures["errors"]


def test_a_call_in_a_running_loop_is_a_future_every_asyncio_use_takes(local_sched):
    async def main():
        await _framed(local_sched)
        call = local_sched.async_call_engine("w/0", "echo", "e", "a")
        assert isinstance(call, PendingCall) and asyncio.isfuture(call)
        assert await call == "a"
        calls = [local_sched.async_call_engine("w/0", "echo", "e", i) for i in range(50)]
        assert await asyncio.gather(*calls) == list(range(50))
        assert await asyncio.wait_for(local_sched.async_call_engine("w/0", "echo", "e", 3), 30) == 3
        assert await asyncio.create_task(local_sched.async_call_engine("w/0", "echo", "e", 4)) == 4
        assert (
            await asyncio.ensure_future(local_sched.async_call_engine("w/0", "add", "e", 2, 3)) == 5
        )
        assert await asyncio.shield(local_sched.async_call_engine("w/0", "echo", "e", 6)) == 6
        async with asyncio.TaskGroup() as group:
            grouped = group.create_task(local_sched.async_call_engine("w/0", "echo", "e", 7))
        assert grouped.result() == 7
        call = local_sched.async_call_engine("w/0", "echo", "e", 5)
        early = asyncio.create_task(call)
        early.cancel()  # before the task first ran it: the call is given up too
        with pytest.raises(asyncio.CancelledError):
            await early
        pipe = local_sched.parts.caller.async_client._loop_pools()[
            local_sched.get_workers("w")[0].address
        ].pipe
        assert call.cancelled() and call.request_id not in pipe.pending

    asyncio.run(main())
    # outside a running loop it is the coroutine asyncio.run needs
    assert asyncio.run(local_sched.async_call_engine("w/0", "echo", "e", "b")) == "b"


def test_errors_are_raised_when_awaited_as_before(local_sched):
    async def main():
        await _framed(local_sched)
        unknown = local_sched.async_call_engine("w/9", "echo", "e", 1)
        bad_option = local_sched.async_call_engine("w/0", "echo", "e", 1, max_retries=0)
        unencodable = local_sched.async_call_engine("w/0", "echo", "e", object())
        remote = local_sched.async_call_engine("w/0", "missing_method", "e")
        assert isinstance(remote, PendingCall)
        with pytest.raises(WorkerNotFoundError):
            await unknown
        with pytest.raises(ConfigError, match="max_retries"):
            await bad_option
        with pytest.raises(TypeError):
            await unencodable
        with pytest.raises(EngineCallError) as caught:
            await remote
        assert caught.value.worker_id == "w/0" and caught.value.method == "missing_method"

    asyncio.run(main())


def test_calls_are_counted_in_the_statistics_failures_and_cancels_too(local_sched):
    async def main():
        await _framed(local_sched)
        before = _totals(local_sched)
        await asyncio.gather(
            *(local_sched.async_call_engine("w/0", "echo", "e", i) for i in range(5))
        )
        with pytest.raises(EngineCallError):
            await local_sched.async_call_engine("w/0", "missing_method", "e")
        slow = local_sched.async_call_engine("w/0", "slow_thread_name", "e", 0.5)
        assert isinstance(slow, PendingCall)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(slow, 0.05)
        assert await local_sched.async_call_engine("w/0", "echo", "e", "after") == "after"
        return before

    before = asyncio.run(main())
    total, errors = _totals(local_sched)
    assert (total - before[0], errors - before[1]) == (8, 2)


def test_a_call_whose_connection_breaks_is_sent_again_and_run_once(local_sched):
    async def main():
        await _framed(local_sched)
        count = await local_sched.async_call_engine("w/0", "count", "e")
        pool = local_sched.parts.caller.async_client._loop_pools()[
            local_sched.get_workers("w")[0].address
        ]
        calls = [local_sched.async_call_engine("w/0", "echo", "e", i) for i in range(3)]
        assert all(isinstance(c, PendingCall) for c in calls)
        await asyncio.sleep(0)  # the frames leave
        pool.pipe.transport.abort()  # the replies never come on it
        assert await asyncio.gather(*calls) == [0, 1, 2]
        assert all(c.resumed is not None for c in calls)
        assert await local_sched.async_call_engine("w/0", "count", "e") == count + 3

    asyncio.run(main())
