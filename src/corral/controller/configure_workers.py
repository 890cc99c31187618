"""AReaL's ``/configure`` at creation: every new worker gets the experiment config, its
role and its rank (the worker seeds its random generators from ``config.seed`` + rank)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from corral.controller.caller import Caller
from corral.errors import (
    SchedulerError,
    WorkerConfigurationError,
    WorkerFailedError,
    WorkerTimeoutError,
)
from corral.rpc import wire
from corral.spec import Worker

log = logging.getLogger("corral")


def sendable_config(exp_config: Any) -> Any:
    """The experiment config as sent by ``/configure``; a config holding values the wire
    cannot carry (a class, a function) is replaced by its ``seed`` alone, with a warning,
    so that workers are still seeded."""
    try:
        wire.encode(exp_config)
        return exp_config
    except TypeError as exc:
        seed = getattr(exp_config, "seed", None)
        log.warning(
            "the experiment config cannot be sent to workers (%s); they get only its "
            "seed (%r) in /configure",
            exc,
            seed,
        )
        return {"seed": seed} if seed is not None else None


async def configure_all(
    caller: Caller,
    workers: list[Worker],
    exp_config: Any,
    along: Sequence[tuple[Worker, str, Any]] = (),
) -> None:
    """``/configure`` every worker at once (on the controller's I/O loop, as the
    rendezvous); a refusal raises WorkerConfigurationError naming the worker. ``along``:
    requests sent at the same time (``rendezvous_calls``: a new role's ``/set_env``), on
    the same pipelined connections, so that a role's start waits one round trip, not two."""
    config = sendable_config(exp_config)

    async def configure(rank: int, worker: Worker) -> None:
        payload = {"config": config, "role": worker.role, "rank": rank}
        try:
            await caller.acall(worker, "/configure", payload)
        except SchedulerError as exc:
            if isinstance(exc, WorkerFailedError | WorkerTimeoutError):
                raise
            raise WorkerConfigurationError(worker.id, str(exc)) from exc

    try:
        await asyncio.gather(
            *(caller.acall(w, path, body) for w, path, body in along),
            *(configure(r, w) for r, w in enumerate(workers) if not w.foreign),
        )  # a foreign server (corral.foreign) is configured by its own command line
    finally:
        caller.async_client.forget_all()
