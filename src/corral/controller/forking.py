"""Forked roles: a worker started next to each worker of a target role.

The one fork path: every fork goes to ``Launcher.fork(ForkRequest)``; the shared way,
which a backend gets by default, is ``POST /fork``: a running worker starts a child next
to itself (same host, same devices), and the child registers like any worker. Grouped
colocation (corral.grouping) forks a few workers over the GPUs of many."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from corral import name_resolve_keys
from corral.controller.caller import Caller
from corral.controller.launch import check_job, hold_lease
from corral.controller.parts import ControllerParts
from corral.controller.rendezvous import give_rendezvous
from corral.controller.role_table import FORKED, RoleState
from corral.errors import WorkerNotFoundError
from corral.grouping import fork_groups, is_grouped, plan_groups, slots_of
from corral.launcher import ForkRequest, Launcher
from corral.spec import NormalizedJob, Worker, validate_role_name

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


def fork_workers(
    c: ControllerParts, role: str, target_role: str, command: str | None = None
) -> list[str]:
    """``Scheduler.fork_workers``: a new role forked next to ``target_role``'s workers."""
    validate_role_name(role)
    with c.lock:
        target = c.table.roles.get(target_role)
        if target is None:
            raise WorkerNotFoundError(
                target_role, f"no role {target_role!r} to fork from; create it first"
            )
        job = NormalizedJob(
            role=role,
            replicas=len(target.workers),
            tasks=target.job.tasks,
            strategy=type(target.job.strategy)(type="colocation", target=target_role, fork=True),
        )
        check_job(c, job)
        return fork_role(c, job, target_role, command)


def fork_role(
    c: ControllerParts, job: NormalizedJob, target_role: str, command: str | None = None
) -> list[str]:
    hold_lease(c)
    targets = c.table.roles[target_role].workers
    c.name_resolve.clear_subtree(c.key(name_resolve_keys.role_prefix, job.role))
    c.progress(f"forking {len(targets)} {job.role} worker(s) next to {target_role}")
    state = RoleState(job, [], FORKED, target_role)
    c.table.roles[job.role] = state
    try:
        if is_grouped(job, len(targets)):  # a few workers over many (corral.grouping)
            state.workers, state.hosts = fork_grouped(c, job, targets)
        else:
            state.workers = fork_next_to(
                c.launcher, c.caller, job, targets, command, c.startup_timeout, c.fan_out
            )
        give_rendezvous(c, job.role, state.workers)
    except BaseException:
        c.teardown.delete_role(job.role)
        raise
    c.table.add_workers(state.workers)
    return [w.id for w in state.workers]


def fork_grouped(
    c: ControllerParts, job: NormalizedJob, targets: list[Worker]
) -> tuple[list[Worker], dict[int, int]]:
    """Grouped workers over ``targets``' GPUs, as their registrations list them."""

    def devices(w: Worker) -> str | None:
        info = c.name_resolve.get(c.key(name_resolve_keys.worker_info_key, w.role, w.index))
        return json.loads(info).get("gpus") if info else None

    groups = plan_groups(job, slots_of(targets, [devices(w) for w in targets]))

    def fork_one(host: Worker, index: int, env: dict[str, str]) -> Worker:
        return fork_via_worker(c.caller, host, job.role, index, env, None, c.startup_timeout)

    workers = fork_groups(fork_one, job, groups, targets, c.fan_out)
    return workers, {g.index: g.host for g in groups}
