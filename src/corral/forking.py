"""The one fork path: every fork goes to ``Launcher.fork(ForkRequest)``; the shared way,
which a backend gets by default, is ``POST /fork``: a running worker starts a child next
to itself (same host, same devices), and the child registers like any worker."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from corral.calls import Caller
from corral.launcher import ForkRequest, Launcher
from corral.spec import NormalizedJob, Worker


def fork_next_to(
    launcher: Launcher,
    caller: Caller,
    job: NormalizedJob,
    targets: list[Worker],
    command: str | None,
    timeout: float,
    fan_out: Callable[[Callable[[Any], Any], list], list],
) -> list[Worker]:
    """Worker ``job.role/i`` next to ``targets[i]``, for every i, at once."""

    def fork_one(index: int) -> Worker:
        target = targets[index]
        env = dict(job.tasks[index].env_vars)

        def via_worker() -> Worker:
            return fork_via_worker(caller, target, job.role, index, env, command, timeout)

        return launcher.fork(ForkRequest(job.role, index, target, env, command, via_worker))

    return fan_out(fork_one, list(range(len(targets))))


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
        foreign=bool(reply.get("foreign", False)),
    )
