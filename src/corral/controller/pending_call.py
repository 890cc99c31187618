"""An async engine call in flight as a future of its own: no Task, no coroutine per call.

``Scheduler.async_call_engine`` inside a running event loop, with a framed pipelined
connection to the worker open (``rpc.pipeline``), sends the call's signed frame at once
and returns a ``PendingCall``: the very future the connection resolves with the call's
result. ``asyncio.gather`` and ``asyncio.wait_for`` take a future as it is (no Task
around it, two loop callbacks less per call), ``await`` waits on it, and it also speaks
the coroutine protocol (``send``, ``throw``, ``close``), so ``asyncio.create_task`` and
``asyncio.ensure_future`` accept it as they accept the coroutine it replaces.

Completing it records the call's statistics and names the worker and the method in an
``EngineCallError``, as ``Caller.acall`` does. A reply that did not come on the framed
connection (it broke, shared memory failed, the worker was unreachable) hands the call to
``Caller.acall`` with the same request id: the worker still runs it at most once, and the
retry policy is ``Caller.settle``'s, as before.
"""

from __future__ import annotations

import asyncio
from typing import Any

from corral.errors import EngineCallError
from corral.rpc import wire
from corral.rpc.async_client import RESEND

_Future = asyncio.Future
_set_result = _Future.set_result
_set_exception = _Future.set_exception
_cancel = _Future.cancel


class PendingCall(_Future):
    """The future of one engine call sent on a framed connection (module docstring)."""

    __slots__ = ("caller", "worker", "payload", "options", "method", "request_id", "started",
                 "resumed", "counted")  # fmt: skip

    def __init__(
        self, loop: asyncio.AbstractEventLoop, caller: Any, worker: Any, payload: dict | bytes,
        options: Any, method: str, request_id: str,
    ):  # fmt: skip
        _Future.__init__(self, loop=loop)
        self.caller, self.worker, self.payload = caller, worker, payload
        self.options, self.method, self.request_id = options, method, request_id
        self.started = 0.0
        self.resumed: asyncio.Task | None = None
        self.counted = False  # its end is in the statistics

    def _count(self, ok: bool) -> None:
        """The call's end, in the statistics once."""
        stats = self.caller.stats
        if stats is not None and not self.counted:
            self.counted = True
            stats.end(self.worker, self.started, ok, self.method)

    def abandon(self) -> None:
        """Its loop closed with it in flight (its connection is closed without the loop):
        counted as failed. Left pending: completing it would schedule its callbacks on
        the closed loop, which raises."""
        if not self.done():
            self._count(False)

    # ------------------------------------------------ completed by the connection
    def set_result(self, result: Any) -> None:
        if result is RESEND:
            if self.get_loop().is_closed():  # nothing can send it again
                self.set_exception(ConnectionResetError("the event loop closed"))
            else:
                self._resume(result)
            return
        stats = self.caller.stats  # ``_count(True)``, inline: every call ends here
        if stats is not None and not self.counted:
            self.counted = True
            stats.end(self.worker, self.started, True, self.method)
        _set_result(self, result)

    def set_exception(self, exc: BaseException) -> None:
        if isinstance(exc, OSError) and self.resumed is None and not self.get_loop().is_closed():
            self._resume(exc)  # a broken connection, or the worker unreachable
            return
        if isinstance(exc, EngineCallError):
            exc.worker_id = exc.worker_id or self.worker.id
            exc.method = exc.method or self.method
        self._count(False)
        _set_exception(self, exc)

    def cancel(self, msg: Any = None) -> bool:
        if self.done():
            return False
        if self.resumed is not None:
            self.resumed.cancel()
        else:  # its reply is dropped on arrival
            client = self.caller.async_client
            client.forget_call(self.get_loop(), self.worker.address, self.request_id)
        self._count(False)
        return _cancel(self, msg)

    def _resume(self, failure: Any) -> None:
        """The rest of the call, the long way (``Caller.acall`` from this failure)."""
        options, payload = self.options, self.payload
        if type(payload) is bytes:  # a plain payload's frame (``rpc.plain``)
            payload = wire.decode(payload)
        self.resumed = self.get_loop().create_task(
            self.caller.acall(
                self.worker, "/call", payload, None, options.retries,
                options.retry_delay, self.method, resume=(self.request_id, failure),
            )
        )  # fmt: skip
        self.resumed.add_done_callback(self._resumed)

    def _resumed(self, task: asyncio.Task) -> None:
        if self.done():  # cancelled: ``cancel`` cancelled the task, whose error (if it
            return  # had one already) is then not logged as never retrieved
        if task.cancelled():
            self.cancel()
            return
        exc = task.exception()
        if exc is not None:
            self.set_exception(exc)
        else:
            self.set_result(task.result())

    # ------------------------------------------------ the coroutine protocol
    def send(self, value: Any) -> Any:
        """One step of a Task driving this call as a coroutine: wait on the call, then
        its result (StopIteration) or its error."""
        if not self.done():
            self._asyncio_future_blocking = True
            return self
        raise StopIteration(self.result())

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        """A Task cancelled before it first ran this call: the call is cancelled too."""
        self.cancel()
        if val is None:
            val = typ if isinstance(typ, BaseException) else typ()
        raise val

    def close(self) -> None:
        self.cancel()
