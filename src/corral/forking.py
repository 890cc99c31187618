"""Forking through a worker: ``POST /fork`` asks a running worker to start a child next to
itself (same host, same devices); the child registers like any worker."""

from __future__ import annotations

from corral.calls import Caller
from corral.spec import Worker


def fork_via_worker(
    caller: Caller,
    target: Worker,
    role: str,
    index: int,
    env: dict[str, str],
    command: str | None,
    timeout: float,
) -> Worker:
    """Have ``target`` start worker ``role/index`` (module ``command``, default the corral
    worker) and wait up to ``timeout`` seconds until it registered."""
    reply = caller.call(
        target,
        "/fork",
        {"role": role, "index": index, "module": command, "env": env, "timeout": timeout},
        timeout=timeout + 5,
    )
    return Worker.from_registration(
        role,
        index,
        reply["address"],
        reply,
        host=reply.get("host", target.host),
        backend_id=target.backend_id,
        forked=True,
    )
