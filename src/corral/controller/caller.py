"""Every request the controller sends a worker, sync or async, under one policy.

The policy (:meth:`Caller.settle`) is written once: a timeout raises
``WorkerTimeoutError``; a broken connection drops the pooled connections to that address,
asks the diagnosis (did the worker die? then raise its ``WorkerFailedError``) and
otherwise retries with the same request id, so the worker runs the call at most once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from corral import scheduler_keywords as opts
from corral.controller.pending_call import PendingCall
from corral.data.store import parse_keep
from corral.errors import (
    ConfigError,
    EngineCallError,
    SchedulerError,
    WorkerConnectionError,
    WorkerTimeoutError,
)
from corral.rpc.async_client import RESEND
from corral.rpc.client import AsyncRPCClient, RPCClient, WorkerUnreachableError, new_request_id
from corral.rpc.plain import encode_plain
from corral.spec import Worker

log = logging.getLogger("corral")

#: ``diagnose(worker, cause)``: the error to raise for a worker whose connection broke
#: (it died), or None if it answers again and the call may be retried.
Diagnose = Callable[[Worker, BaseException], "SchedulerError | None"]


@dataclass(frozen=True)
class CallOptions:
    """A call's timeout and retry policy from AReaL's keywords and ``rpc_meta``."""

    timeout: float | None
    retries: int
    retry_delay: float
    keep: Any = None
    broadcast: bool | None = None

    @classmethod
    def resolve(
        cls, rpc_meta: Any, http_timeout: Any, max_retries: Any, retry_delay: Any
    ) -> CallOptions:
        if (
            rpc_meta is None
            and http_timeout is None
            and max_retries is None
            and retry_delay is None
        ):
            return DEFAULT_OPTIONS  # the common case: nothing to check
        meta = rpc_meta or {}
        if not isinstance(meta, dict):
            raise ConfigError("rpc_meta", rpc_meta, "use a dict or None")
        timeout = http_timeout if http_timeout is not None else meta.get("timeout")
        opts.check_number("http_timeout", timeout)
        if max_retries is not None:
            opts.check_type("max_retries", max_retries, (int,), "a whole number >= 1")
            if max_retries < 1:
                raise ConfigError("max_retries", max_retries, "use a whole number >= 1 (attempts)")
            retries = max_retries - 1
        else:
            retries = int(meta.get("max_retries", 2))
        delay = opts.check_number("retry_delay", retry_delay)
        # No delay by default: a retry follows a check that the worker is alive.
        delay = 0.0 if delay is None else delay
        return cls(timeout, retries, delay, meta.get("keep"), _broadcast_flag(meta))


DEFAULT_OPTIONS = CallOptions(None, 2, 0.0)
_AGAIN = object()  # ``Caller.call_engine``: its first attempt failed, the others follow


def _broadcast_flag(meta: dict) -> bool | None:
    """``rpc_meta['broadcast']``: the worker hands the data-parallel head's arguments to its
    group (corral.worker.broadcast); None leaves AReaL's default to the worker."""
    flag = meta.get("broadcast")
    if flag is not None and not isinstance(flag, bool):
        raise ConfigError(
            "rpc_meta['broadcast']",
            flag,
            "use True (every rank of a data-parallel group gets its head's arguments), "
            "False, or leave it out (AReaL's default: True for an initialized TrainEngine)",
        )
    return flag


def engine_call(
    method: str, engine_name: str | None, args: tuple, kwargs: dict, call: CallOptions
) -> dict:
    """The ``/call`` payload of ``call_engine``/``async_call_engine``."""
    payload = {"engine_name": engine_name, "method": method, "args": list(args), "kwargs": kwargs}
    if call.keep is not None:
        payload["keep"] = parse_keep(call.keep)
    if call.broadcast is not None:
        payload["broadcast"] = call.broadcast
    return payload


def _tag(exc: EngineCallError, worker_id: str, method: str) -> EngineCallError:
    """AReaL's fields of an engine's error: which worker, which method."""
    exc.worker_id = exc.worker_id or worker_id
    exc.method = exc.method or method
    return exc


class Caller:
    def __init__(self, secret: str, diagnose: Diagnose, stats: Any = None):
        self.client = RPCClient(secret)
        self.async_client = AsyncRPCClient(secret)
        self.diagnose = diagnose
        self.stats = stats
        """Engine-call figures per role (``corral.observe.call_stats.CallStats``), or None."""

    def settle(
        self,
        worker: Worker,
        path: str,
        timeout: float | None,
        retries: int,
        attempt: int,
        exc: Exception,
    ) -> None:
        """After a failed attempt: raise the error the caller sees, or return to retry."""
        if isinstance(exc, TimeoutError):
            within = f" within {timeout:g}s" if timeout is not None else ""
            message = f"worker {worker.id} did not answer {path}{within}: {exc}"
            raise WorkerTimeoutError(worker.id, timeout, message) from None
        problem = self.diagnose(worker, exc)
        if problem is not None:
            raise problem from None
        if attempt == retries:
            raise WorkerConnectionError(
                f"the connection to worker {worker.id} broke {retries + 1} time(s) during {path}: "
                f"{getattr(exc, 'cause', exc)}; it is alive, so retry or raise rpc_meta['max_retries']"
            ) from None

    def call(
        self,
        worker: Worker,
        path: str,
        payload: Any,
        timeout: float | None = None,
        retries: int = 2,
        retry_delay: float = 0.0,
        method: str | None = None,
    ) -> Any:
        """A blocking call; a ``/call`` is counted in ``stats`` (in flight, then its time
        and outcome). No context manager: a generator's enter and exit cost more than the
        statistics themselves on every blocking engine call."""
        stats = self.stats if path == "/call" else None
        if stats is None:
            return self._call(worker, path, payload, timeout, retries, retry_delay)
        started, ok = stats.begin(worker), False
        try:
            result = self._call(worker, path, payload, timeout, retries, retry_delay)
            ok = True
            return result
        finally:
            stats.end(worker, started, ok, method)

    async def acall(
        self,
        worker: Worker,
        path: str,
        payload: Any,
        timeout: float | None = None,
        retries: int = 2,
        retry_delay: float = 0.0,
        method: str | None = None,
        *,
        resume: tuple[str, Any] | None = None,
    ) -> Any:
        """``call`` for asyncio code. ``method``: the engine method of a ``/call``, named
        in its EngineCallError. One coroutine from here to the client: each coroutine frame
        less is a cost less per call on the async fan-out path, on the way out and back.
        ``resume``: ``(request id, failure)`` of a ``PendingCall`` whose framed connection
        gave no reply (``RESEND``, an OSError): its first attempt goes on from there (its
        statistics are the PendingCall's)."""
        stats = self.stats if path == "/call" and resume is None else None
        started = stats.begin(worker) if stats is not None else 0.0
        ok = False
        request_id = new_request_id() if resume is None else resume[0]
        try:
            for attempt in range(retries + 1):
                if attempt and retry_delay:
                    await asyncio.sleep(retry_delay * 2 ** (attempt - 1))
                try:
                    if resume is not None:
                        failure, resume = resume[1], None
                        if isinstance(failure, WorkerUnreachableError):
                            raise failure
                        sent = None
                    elif timeout is None and not attempt:
                        sent = self.async_client.send_small(
                            worker.address, path, payload, request_id, worker.identity
                        )
                    else:
                        sent = None
                    if sent is not None:  # the fast path: no coroutine between here and the wire
                        try:
                            result = await sent
                        except WorkerUnreachableError:
                            raise
                        except OSError:  # the connection broke: once more the long way
                            result = RESEND
                        if result is not RESEND:
                            ok = True
                            return result
                    result = await self.async_client.start(
                        worker.address, path, payload, timeout=timeout,
                        request_id=request_id, identity=worker.identity,
                    )  # fmt: skip
                    ok = True
                    return result
                except (TimeoutError, WorkerUnreachableError) as exc:
                    self.async_client.forget(worker.address)
                    # the diagnosis polls the backend and may sleep: off the event loop
                    await asyncio.to_thread(
                        self.settle, worker, path, timeout, retries, attempt, exc
                    )
        except EngineCallError as exc:
            if method is None:
                raise
            raise _tag(exc, worker.id, method) from None
        finally:
            if stats is not None:
                stats.end(worker, started, ok, method)

    def call_engine(self, worker: Worker, method: str, payload: dict, call: CallOptions) -> Any:
        """An engine method (``/call``); its error names the worker and the method. What
        ``call`` does for a ``/call``, without its layer (every blocking engine call)."""
        stats = self.stats
        started = stats.begin(worker) if stats is not None else 0.0
        ok = False
        try:
            try:  # the first attempt without ``_call``'s layer; it takes over on a failure
                result = self.client.request(
                    worker.address, "/call", payload, timeout=call.timeout,
                    request_id=(request_id := new_request_id()), identity=worker.identity,
                )  # fmt: skip
            except (TimeoutError, WorkerUnreachableError) as exc:
                self.client.forget(worker.address)
                self.settle(worker, "/call", call.timeout, call.retries, 0, exc)
                result = _AGAIN
            if result is _AGAIN:
                result = self._call(
                    worker, "/call", payload, call.timeout, call.retries, call.retry_delay,
                    request_id, 1,
                )  # fmt: skip
            ok = True
            return result
        except EngineCallError as exc:
            raise _tag(exc, worker.id, method) from None
        finally:
            if stats is not None:
                stats.end(worker, started, ok, method)

    def acall_engine(
        self, worker: Worker, method: str, payload: dict, call: CallOptions
    ) -> Awaitable[Any]:
        """An engine method (``/call``) for asyncio code: ``acall``'s coroutine itself
        (no coroutine of its own around it)."""
        return self.acall(
            worker, "/call", payload, call.timeout, call.retries, call.retry_delay, method
        )

    def send_engine(
        self, loop: asyncio.AbstractEventLoop, worker: Worker, method: str, payload: dict,
        call: CallOptions,
    ) -> PendingCall | None:  # fmt: skip
        """An engine method sent at once on the worker's framed connection, its
        ``PendingCall``; None: not here (no such connection yet, a timeout, a payload
        too large for a frame): use ``acall_engine``. Raises (a payload that cannot be
        encoded) before anything is sent."""
        client, address = self.async_client, worker.address
        pipe = client.framed_pipe(address) if call.timeout is None else None
        if pipe is None:
            return None
        body = encode_plain(payload)  # kept instead of the payload: no garbage to collect
        kept = payload if body is None else body
        rid = new_request_id()
        pending = PendingCall(loop, self, worker, kept, call, method, rid)
        if not client.send_small(
            address, "/call", payload, rid, worker.identity, pending, body, pipe
        ):
            return None
        stats = self.stats
        if stats is not None:
            pending.started = stats.begin(worker)
        return pending

    def _call(
        self,
        worker: Worker,
        path: str,
        payload: Any,
        timeout: float | None,
        retries: int,
        retry_delay: float,
        request_id: str | None = None,
        first: int = 0,
    ) -> Any:
        """Attempts ``first`` to ``retries`` (the same request id throughout)."""
        request_id = request_id or new_request_id()
        for attempt in range(first, retries + 1):
            if attempt and retry_delay:
                time.sleep(retry_delay * 2 ** (attempt - 1))
            try:
                return self.client.request(
                    worker.address,
                    path,
                    payload,
                    timeout=timeout,
                    request_id=request_id,
                    identity=worker.identity,
                )
            except (TimeoutError, WorkerUnreachableError) as exc:
                self.client.forget(worker.address)
                self.settle(worker, path, timeout, retries, attempt, exc)

    async def acall_all(self, requests: list[tuple[Worker, str, Any]]) -> list[Any]:
        """``acall`` each ``(worker, path, payload)`` at once; then the connections of this
        batch are closed (it runs on the controller's own loop, see ``corral.ioloop``)."""
        try:
            return await asyncio.gather(*(self.acall(w, path, body) for w, path, body in requests))
        finally:
            self.async_client.forget_all()

    async def retire(self, workers: list[Worker]) -> None:
        """Destroy every worker's engines, then ask each to exit (Slurm jobs then complete
        without scancel's SIGTERM/SIGKILL sequence); failures are only logged: the backend
        stops whatever is left."""

        async def quietly(worker: Worker, path: str, timeout: float) -> None:
            try:
                await self.async_client.request(
                    worker.address, path, {}, timeout=timeout, identity=worker.identity
                )
            except Exception as exc:
                log.debug("%s on %s: %s", path, worker.id, exc)

        workers = [w for w in workers if not w.foreign]  # its own API (corral.foreign)
        try:
            await asyncio.gather(*(quietly(w, "/destroy_engines", 5.0) for w in workers))
            await asyncio.gather(*(quietly(w, "/shutdown", 2.0) for w in workers))
        finally:
            for w in workers:
                self.async_client.forget(w.address)
                self.client.forget(w.address)

    def health(self, worker: Worker, timeout: float) -> dict:
        return self.client.request(
            worker.address, "/health", method="GET", timeout=timeout, identity=worker.identity
        )

    def quietly(
        self, worker: Worker, path: str, timeout: float, what: str, identity: bool = True
    ) -> None:
        """A best-effort request during teardown: failures are logged, never raised."""
        if worker.foreign:
            return  # its own API (corral.foreign)
        try:
            self.client.request(
                worker.address,
                path,
                {},
                timeout=timeout,
                identity=worker.identity if identity else None,
            )
        except Exception as exc:
            log.debug("%s %s: %s", what, worker.id, exc)
        self.client.forget(worker.address)

    def close(self) -> None:
        self.client.close()
        self.async_client.close()
