"""How a ``PendingCall`` (corral.controller.pending_call) ends when nothing is left to end
it normally: its loop closed with it in flight, or it was cancelled while its retry's
error waited to be read. No worker: a caller that records what the statistics are told."""

from __future__ import annotations

import asyncio
import gc
from types import SimpleNamespace

from corral.controller.caller import DEFAULT_OPTIONS
from corral.controller.pending_call import PendingCall
from corral.rpc.pool import _LoopPool


class _Stats:
    def __init__(self):
        self.ended: list[bool] = []

    def end(self, worker, started, ok, method) -> None:
        self.ended.append(ok)


def _call(loop, acall=None) -> PendingCall:
    caller = SimpleNamespace(stats=_Stats(), acall=acall)
    worker = SimpleNamespace(id="w/0", address="127.0.0.1:1")
    return PendingCall(loop, caller, worker, {"a": 1}, DEFAULT_OPTIONS, "echo", "rid-1")


def test_calls_in_flight_on_a_closed_loop_are_counted_failed_when_its_pipe_is_dropped():
    loop = asyncio.new_event_loop()
    call = _call(loop)
    call.add_done_callback(lambda _f: None)  # gathered: completing it would need the loop
    loop.close()
    pool = _LoopPool(1)
    pool.pipe = SimpleNamespace(
        pending={"rid-1": (call, "nonce", True), "rid-2": (loop.create_future(), "n", False)},
        transport=None,
    )
    pool.close_pipe(dead_loop=True)
    assert call.caller.stats.ended == [False] and not call.done()
    call.abandon()  # once only
    assert call.caller.stats.ended == [False]


def test_a_call_cancelled_after_its_retry_failed_leaves_no_error_unretrieved():
    """Cancelled after its retry task ended with an error, before the callback that reads
    that error ran: no "Task exception was never retrieved" (review 17's suspicion), as
    ``cancel`` cancels the retry task, and ``Task.cancel`` clears that log even when the
    task is done."""
    logged = []

    async def main():
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _l, ctx: logged.append(ctx["message"]))
        holder = []

        async def failing_retry(*_args, **_kwargs):
            loop.call_soon(holder[0].cancel)  # runs before the task's done callbacks
            raise RuntimeError("the retry failed")

        call = _call(loop, failing_retry)
        holder.append(call)
        call._resume(ConnectionResetError("broken"))
        for _ in range(5):
            await asyncio.sleep(0)
        assert call.cancelled() and call.caller.stats.ended == [False]
        holder.clear()
        del call
        gc.collect()

    asyncio.run(main())
    assert not any("never retrieved" in message for message in logged), logged
