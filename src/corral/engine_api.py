"""The engine half of the public API: create engines on workers, call their methods
(sync and async, with AReaL's call options), set a worker's environment, configure it.
A mixin of ``corral.scheduler.Scheduler``; every request goes through its one call
path (``corral.calls.Caller``, ``self._calls``)."""

from __future__ import annotations

from typing import Any

from corral.calls import CallOptions, engine_call
from corral.foreign import refusal
from corral.spec import Worker, engine_import_path


class EngineAPI:
    """Needs ``_worker(worker_id) -> Worker``, ``_calls`` (a Caller) and ``_table``."""

    _calls: Any
    _table: Any

    def _worker(self, worker_id: str) -> Worker:
        raise NotImplementedError

    async def create_engine(
        self, worker_id: str, engine: Any, engine_name: str | None = None, *args: Any, **kwargs: Any
    ) -> None:
        """Import and construct ``engine`` on the worker under ``engine_name`` (default:
        the worker id). Returns None, as AReaL's schedulers do."""
        worker = self._worker(worker_id)
        if worker.foreign:
            raise refusal(worker, "create_engine")
        payload = {
            "engine": engine_import_path(engine),
            "engine_name": engine_name,
            "args": list(args),
            "kwargs": kwargs,
        }
        name = await self._calls.acall(worker, "/create_engine", payload, retries=1)
        state = self._table.roles.get(worker.role)  # None: a multi-node instance's member
        if state is not None:
            state.engines.setdefault(worker.id, set()).add(name)

    async def set_worker_env(self, worker_id: str, env: dict[str, str]) -> None:
        worker = self._worker(worker_id)
        if worker.foreign:
            raise refusal(worker, "set_worker_env")
        await self._calls.acall(
            worker, "/set_env", {"env": {str(k): str(v) for k, v in env.items()}}
        )

    def configure_worker(
        self,
        worker_id: str,
        config: Any = None,
        role: str | None = None,
        rank: int | None = None,
        _worker: Worker | None = None,
    ) -> None:
        """Send the worker its experiment config, role and rank (``/configure``); done for
        every worker at creation when the scheduler has an ``exp_config``."""
        worker = _worker or self._worker(worker_id)
        if worker.foreign:
            raise refusal(worker, "configure_worker")
        self._calls.call(
            worker, "/configure", {"config": config, "role": role or worker.role, "rank": rank}
        )

    def call_engine(
        self,
        worker_id: str,
        method: str,
        engine_name: str | None = None,
        *args: Any,
        rpc_meta: dict[str, Any] | None = None,
        http_timeout: float | None = None,
        max_retries: int | None = None,
        retry_delay: float | None = None,
        **kwargs: Any,
    ) -> Any:
        """Call ``method`` on an engine of the worker and return its result.

        Scheduler options (consumed here, never passed to the method), as in AReaL:
        ``http_timeout`` (seconds to wait for the answer; default none),
        ``max_retries`` (attempts when the connection drops; default 3) and
        ``retry_delay`` (seconds before the second attempt, doubling after; default 0:
        corral retries only once it has checked that the worker is alive).
        A live worker runs the method at most once whatever the attempts; a dead one
        raises WorkerFailedError. ``rpc_meta``: ``timeout`` (used when ``http_timeout`` is
        not given), ``max_retries`` (retries after a dropped connection), ``broadcast``
        (the worker first replaces the arguments with its data-parallel head's; default:
        for an initialized TrainEngine; see docs/areal.md) and ``keep``
        (True, or a byte threshold: arrays/tensors of the result stay on the worker and
        come back as ``corral.Ref``; see docs/data-plane.md).
        """
        worker = self._worker(worker_id)
        if worker.foreign:
            raise refusal(worker, "call_engine")
        call = CallOptions.resolve(rpc_meta, http_timeout, max_retries, retry_delay)
        payload = engine_call(method, engine_name, args, kwargs, call)
        return self._calls.call_engine(worker, method, payload, call)

    async def async_call_engine(
        self,
        worker_id: str,
        method: str,
        engine_name: str | None = None,
        *args: Any,
        rpc_meta: dict[str, Any] | None = None,
        http_timeout: float | None = None,
        max_retries: int | None = None,
        retry_delay: float | None = None,
        **kwargs: Any,
    ) -> Any:
        """``call_engine`` for asyncio code: the same options, request, retries and errors."""
        worker = self._worker(worker_id)
        if worker.foreign:
            raise refusal(worker, "async_call_engine")
        call = CallOptions.resolve(rpc_meta, http_timeout, max_retries, retry_delay)
        payload = engine_call(method, engine_name, args, kwargs, call)
        return await self._calls.acall_engine(worker, method, payload, call)

    def health(self, worker_id: str, timeout: float = 5.0) -> dict:
        return self._calls.health(self._worker(worker_id), timeout)

    # the call path's clients under their old names (tests and benchmarks read them)
    _client = property(lambda self: self._calls.client)
    _async_client = property(lambda self: self._calls.async_client)
    _request = property(lambda self: self._calls.call)
    _arequest = property(lambda self: self._calls.acall)
