"""Review 17: ``async_call_engine``'s PendingCall (controller.pending_call) against a real
local worker: the reviewer's reproducers, each now a test of the fixed behaviour or of the
behaviour documented in docs/areal.md ("Calls") and ``Scheduler.async_call_engine``."""

from __future__ import annotations

import asyncio
import gc
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


def test_asyncio_wait_refuses_a_call_as_it_refused_the_coroutine(local_sched):
    """Documented (docs/areal.md, "Calls"): a PendingCall is a future and also a
    collections.abc.Coroutine, so ``asyncio.wait`` refuses it as it refused main's
    coroutine; ``ensure_future`` returns it as it is (a future), so it is wrapped in
    ``create_task`` for ``asyncio.wait``."""

    async def main():
        await _framed(local_sched)
        call = local_sched.async_call_engine("w/0", "echo", "e", "w")
        assert asyncio.isfuture(call)
        with pytest.raises(TypeError, match="coroutines is forbidden"):
            await asyncio.wait([call], timeout=30)
        assert asyncio.ensure_future(call) is call  # a future already: still refused
        done, pending = await asyncio.wait([asyncio.create_task(call)], timeout=30)
        assert not pending and done.pop().result() == "w"
        wrapped = asyncio.create_task(local_sched.async_call_engine("w/0", "echo", "e", "t"))
        done, pending = await asyncio.wait([wrapped], timeout=30)
        assert not pending and done.pop().result() == "t"

    asyncio.run(main())


def test_a_call_belongs_to_the_loop_it_was_made_in(local_sched):
    """Documented: a call made in a running loop is that loop's future; handed to another
    loop it is refused there. Made on the other loop, it runs there."""
    other = asyncio.new_event_loop()
    thread = threading.Thread(target=other.run_forever, daemon=True)
    thread.start()
    try:

        async def there(text):
            return await local_sched.async_call_engine("w/0", "echo", "e", text)

        async def main():
            await _framed(local_sched)
            call = local_sched.async_call_engine("w/0", "echo", "e", "here")
            future = asyncio.run_coroutine_threadsafe(call, other)
            with pytest.raises(ValueError, match="different loop"):
                await asyncio.wrap_future(future)
            assert await call == "here"  # it still runs on its own loop
            made_there = asyncio.run_coroutine_threadsafe(there("there"), other)
            return await asyncio.wrap_future(made_there)

        assert asyncio.run(main()) == "there"
    finally:
        other.call_soon_threadsafe(other.stop)
        thread.join(10)
        other.close()


def test_a_call_made_in_a_running_loop_runs_even_if_never_awaited(local_sched):
    """Documented: inside a running loop a call is sent when it is made (like Ray's
    ``.remote()``), not when it is awaited: one never awaited still runs on the worker."""

    async def main():
        await _framed(local_sched)
        before = await local_sched.async_call_engine("w/0", "count", "e")
        local_sched.async_call_engine("w/0", "echo", "e", "dropped")  # never awaited
        await asyncio.sleep(0.5)
        return before, await local_sched.async_call_engine("w/0", "count", "e")

    before, after = asyncio.run(main())
    assert after == before + 1


def test_a_dropped_call_that_fails_is_logged_as_never_retrieved(local_sched):
    """Documented: a call made, never awaited, that fails is reported by asyncio's
    exception handler ("exception was never retrieved"), as a dropped Future is."""
    logged = []

    async def main():
        asyncio.get_running_loop().set_exception_handler(lambda _l, ctx: logged.append(ctx))
        await _framed(local_sched)
        local_sched.async_call_engine("w/0", "fail", "e")  # never awaited
        await asyncio.sleep(0.5)
        gc.collect()

    asyncio.run(main())
    assert any("never retrieved" in ctx["message"] for ctx in logged), logged
    assert "boom" in str(next(c["exception"] for c in logged if "exception" in c))


def test_calls_left_in_flight_when_the_loop_closes_are_not_counted_for_ever(local_sched):
    """Calls in flight when their loop closed are counted as failed once their connection
    is cleaned up (``AsyncRPCClient.prune``: the next call on another loop)."""

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


def test_a_worker_that_cannot_be_found_is_looked_up_once(local_sched, monkeypatch):
    """A lookup that raised inside a running loop (a pending role that never registers)
    is raised when the call is awaited, without looking the worker up again."""
    lookups = []

    def never_registers(c, worker_id):
        lookups.append(worker_id)  # finish_role's await_registration timing out
        raise WorkerTimeoutError(worker_id, 60.0, f"{worker_id} did not register")

    monkeypatch.setattr(engine_calls, "worker", never_registers)

    async def main():
        call = local_sched.async_call_engine("late/0", "echo", "e", 1)
        with pytest.raises(WorkerTimeoutError, match="late/0 did not register"):
            await call

    asyncio.run(main())
    assert lookups == ["late/0"]


def test_gathered_calls_go_in_the_order_made_except_those_sent_when_awaited(local_sched):
    """Documented: framed calls to one worker go out in the order they are made; a call
    that takes the coroutine path (here ``http_timeout``) goes when it is first awaited,
    so after a framed call made after it."""

    async def main():
        await _framed(local_sched)
        framed, timed = [], []
        for _ in range(3):
            before = await local_sched.async_call_engine("w/0", "count", "e")
            first = local_sched.async_call_engine("w/0", "echo", "e", 1)
            second = local_sched.async_call_engine("w/0", "count", "e")
            _, counted = await asyncio.gather(first, second)
            framed.append(counted - before)
            before = await local_sched.async_call_engine("w/0", "count", "e")
            first = local_sched.async_call_engine("w/0", "echo", "e", 1, http_timeout=30)
            second = local_sched.async_call_engine("w/0", "count", "e")
            _, counted = await asyncio.gather(first, second)
            timed.append(counted - before)
        return framed, timed

    framed, timed = asyncio.run(main())
    assert framed == [1, 1, 1]  # the echo ran before the count
    assert timed == [0, 0, 0]  # the count, sent when made, ran before the timed echo
