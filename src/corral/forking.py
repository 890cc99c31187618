"""The one fork path: every fork goes to ``Launcher.fork(ForkRequest)``; the shared way,
which a backend gets by default, is ``POST /fork``: a running worker starts a child next
to itself (same host, same devices), and the child registers like any worker."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from corral.calls import Caller
from corral.launcher import ForkRequest, Launcher
from corral.spec import NormalizedJob, Worker

log = logging.getLogger("corral")


def fork_next_to(
    launcher: Launcher,
    caller: Caller,
    job: NormalizedJob,
    targets: list[Worker],
    command: str | None,
    timeout: float,
    fan_out: Callable[[Callable[[Any], Any], list], list],
) -> list[Worker]:
    """Worker ``job.role/i`` next to ``targets[i]``, for every i, at once. If one fork
    fails, every fork is waited for and all of them are retired before the first error
    is raised: a failed call leaves no process behind (one that registered late, after
    its caller gave up, included)."""

    def fork_one(index: int) -> Worker | BaseException:
        target = targets[index]
        env = dict(job.tasks[index].env_vars)

        def via_worker() -> Worker:
            return fork_via_worker(caller, target, job.role, index, env, command, timeout)

        try:
            return launcher.fork(ForkRequest(job.role, index, target, env, command, via_worker))
        except Exception as exc:  # waited for with the others, raised after the retirement
            return exc

    outcomes = fan_out(fork_one, list(range(len(targets))))
    failures = [o for o in outcomes if isinstance(o, BaseException)]
    if failures:
        forked = {i: o for i, o in enumerate(outcomes) if isinstance(o, Worker)}
        retire_forks(launcher, caller, job.role, targets, forked)
        raise failures[0]
    return outcomes


def retire_forks(
    launcher: Launcher,
    caller: Caller,
    role: str,
    targets: list[Worker],
    forked: dict[int, Worker],
) -> None:
    """Stop worker ``role/i`` next to every ``targets[i]``: those in ``forked`` as the
    backend stops a fork, the others (their fork failed, or answered too late) by asking
    their target worker to stop that child if it has one."""
    for index, target in enumerate(targets):

        def via_worker(target: Worker = target, index: int = index) -> None:
            try:
                caller.client.request(
                    target.address,
                    "/kill_forked_worker",
                    {"worker_id": f"{role}/{index}"},
                    timeout=10.0,
                )
            except Exception as exc:
                log.warning("could not stop forked worker %s/%s: %s", role, index, exc)

        worker = forked.get(index)
        try:
            if worker is not None:
                launcher.stop_fork(worker, via_worker)
            else:
                via_worker()
        except Exception as exc:
            log.warning("could not stop forked worker %s/%s: %s", role, index, exc)


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
