"""The engine half of the public API: create engines on workers, call their methods
(sync and async, with AReaL's call options), set a worker's environment, configure it.
Every request goes through the controller's one call path (``corral.controller.caller``);
``Scheduler`` holds the docstrings of the public methods."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

from corral.controller.caller import CallOptions, engine_call
from corral.controller.launch import worker
from corral.controller.parts import ControllerParts
from corral.foreign import refusal
from corral.spec import Worker, engine_import_path


async def create_engine(
    c: ControllerParts, worker_id: str, engine: Any, engine_name: str | None, args: tuple,
    kwargs: dict,
) -> None:  # fmt: skip
    target = worker(c, worker_id)
    if target.foreign:
        raise refusal(target, "create_engine")
    payload = {
        "engine": engine_import_path(engine),
        "engine_name": engine_name,
        "args": list(args),
        "kwargs": kwargs,
    }
    name = await c.caller.acall(target, "/create_engine", payload, retries=1)
    state = c.table.roles.get(target.role)  # None: a multi-node instance's member
    if state is not None:
        state.engines.setdefault(target.id, set()).add(name)


async def set_worker_env(c: ControllerParts, worker_id: str, env: dict[str, str]) -> None:
    target = worker(c, worker_id)
    if target.foreign:
        raise refusal(target, "set_worker_env")
    await c.caller.acall(target, "/set_env", {"env": {str(k): str(v) for k, v in env.items()}})


def configure_worker(
    c: ControllerParts, worker_id: str, config: Any, role: str | None, rank: int | None,
    known: Worker | None = None,
) -> None:  # fmt: skip
    target = known or worker(c, worker_id)
    if target.foreign:
        raise refusal(target, "configure_worker")
    c.caller.call(
        target, "/configure", {"config": config, "role": role or target.role, "rank": rank}
    )


#: the scheduler's own options of an engine call, consumed here, never passed to the method
CALL_OPTIONS = ("rpc_meta", "http_timeout", "max_retries", "retry_delay")


def prepared_call(
    c: ControllerParts, verb: str, worker_id: str, method: str, engine_name: str | None,
    args: tuple, kwargs: dict[str, Any],
) -> tuple[Worker, dict[str, Any], CallOptions]:  # fmt: skip
    """The target, payload and options of an engine call; bad input raises here. The
    scheduler's options (``CALL_OPTIONS``) are taken out of ``kwargs``."""
    target = worker(c, worker_id)
    if target.foreign:
        raise refusal(target, verb)
    options = [kwargs.pop(name, None) for name in CALL_OPTIONS]
    call = CallOptions.resolve(*options)
    return target, engine_call(method, engine_name, args, kwargs, call), call


def call_engine(
    c: ControllerParts, worker_id: str, method: str, engine_name: str | None, args: tuple,
    kwargs: dict[str, Any], options: tuple = (None, None, None, None),
) -> Any:  # fmt: skip
    """``Scheduler.call_engine``: ``options`` are its ``CALL_OPTIONS``, in that order
    (``prepared_call`` without taking them out of ``kwargs``: every blocking call)."""
    target = worker(c, worker_id)
    if target.foreign:
        raise refusal(target, "call_engine")
    call = CallOptions.resolve(*options)  # its defaults at once when none is given
    payload = engine_call(method, engine_name, args, kwargs, call)
    return c.caller.call_engine(target, method, payload, call)


async def async_call_engine(
    c: ControllerParts, worker_id: str, method: str, engine_name: str | None = None,
    *args: Any, **kwargs: Any,
) -> Any:  # fmt: skip
    """The coroutine for a gather (the dispatcher's): bad input raises when it is awaited."""
    return await start_async_call_engine(c, worker_id, method, engine_name, *args, **kwargs)


def start_async_call_engine(
    c: ControllerParts, worker_id: str, method: str, engine_name: str | None = None,
    *args: Any, **kwargs: Any,
) -> Awaitable[Any]:  # fmt: skip
    """``async_call_engine`` for a coroutine that awaits at once (``Scheduler``'s): bad
    input raises here; the awaitable is ``Caller.acall``'s coroutine itself (one
    coroutine layer less per call on the fan-out path)."""
    target, payload, call = prepared_call(
        c, "async_call_engine", worker_id, method, engine_name, args, kwargs
    )
    return c.caller.acall_engine(target, method, payload, call)


def send_async_call_engine(
    c: ControllerParts, worker_id: str, method: str, engine_name: str | None, args: tuple,
    kwargs: dict[str, Any], options: tuple,
) -> Awaitable[Any]:  # fmt: skip
    """``Scheduler.async_call_engine``: inside a running event loop, with the worker's
    framed connection open, the call is sent here and its ``PendingCall`` returned (a
    future: no Task, no coroutine per call in a gather; ``controller.pending_call``).
    Otherwise the coroutine of ``async_call_engine``. Inside a running loop anything
    that raises here (a bad worker id, option or payload; a pending role that never
    registers) is raised by the coroutine returned, when it is awaited, as it always
    was, without doing it again (a role is waited for once). ``options``:
    ``CALL_OPTIONS``' values, in order."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    if loop is not None:
        try:
            table = c.table
            target = table.ids.get(worker_id)
            if target is None or worker_id in table.unrestartable:
                target = worker(c, worker_id)  # waits for a pending role, or raises
            if not target.foreign:
                call = CallOptions.resolve(*options)
                payload = engine_call(method, engine_name, args, kwargs, call)
                pending = c.caller.send_engine(loop, target, method, payload, call)
                if pending is not None:
                    return pending
                return c.caller.acall_engine(target, method, payload, call)
        except Exception as exc:
            return _raising(exc)
    return async_call_engine(
        c,
        worker_id,
        method,
        engine_name,
        *args,
        **kwargs,
        **dict(zip(CALL_OPTIONS, options, strict=True)),
    )


async def _raising(exc: Exception) -> Any:
    """What ``send_async_call_engine`` raised, raised when awaited."""
    raise exc
