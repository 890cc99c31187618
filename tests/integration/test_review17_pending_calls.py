"""Review 17: reproducers for ``async_call_engine``'s PendingCall (controller.pending_call)
against a real local worker. Each strict xfail names a behaviour that main had or that the
module's docstring promises, and that the merge of noop3, serve3 and fanout3 breaks."""

from __future__ import annotations

import asyncio
import threading

import pytest

from corral import BaseExperimentConfig, Job, LocalScheduler
from corral.controller import engine_calls
from corral.controller.pending_call import PendingCall
from corral.errors import WorkerTimeoutError

ECHO = "corral.testing.engines.EchoEngine"


@pytest.fixture(scope="module")
def local_sched(tmp_path_factory):
    cfg = BaseExperimentConfig(experiment_name="review17", trial_name="t")
    root = str(tmp_path_factory.mktemp("review17"))
    s = LocalScheduler(exp_config=cfg, fileroot=root, gpu_devices=[], startup_timeout=60)
    (wid,) = s.create_workers(Job(role="w", replicas=1))
    asyncio.run(s.create_engine(wid, ECHO, "e"))
    yield s
    s.close()


async def _framed(s) -> None:
    """The first calls open the worker's framed connection on the running loop."""
    assert await asyncio.gather(*(s.async_call_engine("w/0", "echo", "e", i) for i in (1, 2)))
    assert isinstance(s.async_call_engine("w/0", "noop", "e"), PendingCall)


def _in_flight(s) -> int:
    return s.parts.caller.stats.sample_all().workers.get("w/0", {}).get("in_flight", 0)


@pytest.mark.xfail(
    strict=True,
    reason="review17: a PendingCall is a collections.abc.Coroutine, so asyncio.wait (3.11) "
    "refuses it ('Passing coroutines is forbidden') although it is a future; the call "
    "has already been sent and now runs with nobody to take its result",
)
def test_asyncio_wait_takes_a_pending_call(local_sched):
    async def main():
        await _framed(local_sched)
        call = local_sched.async_call_engine("w/0", "echo", "e", "w")
        assert asyncio.isfuture(call)
        done, pending = await asyncio.wait([call], timeout=30)
        assert not pending and done.pop().result() == "w"

    asyncio.run(main())


@pytest.mark.xfail(
    strict=True,
    reason="review17: a call made in one running loop is bound to that loop; main's "
    "coroutine could be handed to another loop (run_coroutine_threadsafe) and ran there",
)
def test_a_call_made_in_one_loop_runs_on_another_loop(local_sched):
    other = asyncio.new_event_loop()
    thread = threading.Thread(target=other.run_forever, daemon=True)
    thread.start()
    try:

        async def main():
            await _framed(local_sched)
            call = local_sched.async_call_engine("w/0", "echo", "e", "there")
            future = asyncio.run_coroutine_threadsafe(call, other)
            return await asyncio.wrap_future(future)

        assert asyncio.run(main()) == "there"
    finally:
        other.call_soon_threadsafe(other.stop)
        thread.join(10)
        other.close()


@pytest.mark.xfail(
    strict=True,
    reason="review17: async_call_engine now sends the call when it is made, not when it is "
    "awaited: a call that is never awaited (made, then dropped on an early return or an "
    "error) still runs on the worker; on main it did not run",
)
def test_a_call_never_awaited_does_not_run(local_sched):
    async def main():
        await _framed(local_sched)
        before = await local_sched.async_call_engine("w/0", "count", "e")
        local_sched.async_call_engine("w/0", "echo", "e", "dropped")  # never awaited
        await asyncio.sleep(0.5)
        return before, await local_sched.async_call_engine("w/0", "count", "e")

    before, after = asyncio.run(main())
    assert after == before


@pytest.mark.xfail(
    strict=True,
    reason="review17: a PendingCall still in flight when its loop closes (a gather that "
    "raised on its first error leaves the others running; asyncio.run cancels only tasks) "
    "is never completed: the statistics count it in flight for ever (main: its Task was "
    "cancelled at shutdown and counted)",
)
def test_calls_left_in_flight_when_the_loop_closes_are_not_counted_for_ever(local_sched):
    async def main():
        await _framed(local_sched)
        failing = local_sched.async_call_engine("w/0", "fail", "e")
        slow = local_sched.async_call_engine("w/0", "slow_thread_name", "e", 0.2)
        await asyncio.gather(failing, slow)

    asyncio.run(asyncio.sleep(0.5))  # calls of earlier tests ended (or never will)
    before = _in_flight(local_sched)
    with pytest.raises(Exception, match="boom"):
        asyncio.run(main())
    assert asyncio.run(asyncio.sleep(0.5, "later")) == "later"
    assert asyncio.run(local_sched.async_call_engine("w/0", "echo", "e", 1)) == 1  # prunes
    assert _in_flight(local_sched) == before


@pytest.mark.xfail(
    strict=True,
    reason="review17: send_async_call_engine looks the worker up at call time (for a role "
    "launched with wait=False: finish_role, blocking the loop) and, when that raises, "
    "returns the coroutine, which looks it up again when awaited: a role that never "
    "registers is waited for twice (2 x startup_timeout); main waited once",
)
def test_a_worker_that_cannot_be_found_is_looked_up_once(local_sched, monkeypatch):
    lookups = []

    def never_registers(c, worker_id):
        lookups.append(worker_id)  # finish_role's await_registration timing out
        raise WorkerTimeoutError(worker_id, 60.0, f"{worker_id} did not register")

    monkeypatch.setattr(engine_calls, "worker", never_registers)

    async def main():
        call = local_sched.async_call_engine("late/0", "echo", "e", 1)
        with pytest.raises(WorkerTimeoutError):
            await call

    asyncio.run(main())
    assert lookups == ["late/0"]


@pytest.mark.xfail(
    strict=True,
    reason="review17: calls made in order and gathered now reach the worker out of order "
    "when one of them cannot take the framed connection (http_timeout set, a body too "
    "large for a frame): the later framed call is sent when it is made, the earlier one "
    "when gather runs it (main sent a timed call and a plain one in the order made)",
)
def test_gathered_calls_run_in_the_order_they_were_made(local_sched):
    async def main():
        await _framed(local_sched)
        seen = []
        for _ in range(3):
            before = await local_sched.async_call_engine("w/0", "count", "e")
            first = local_sched.async_call_engine("w/0", "echo", "e", 1, http_timeout=30)
            second = local_sched.async_call_engine("w/0", "count", "e")
            _, counted = await asyncio.gather(first, second)
            seen.append(counted - before)
        return seen

    assert asyncio.run(main()) == [1, 1, 1]  # the echo ran before the count
