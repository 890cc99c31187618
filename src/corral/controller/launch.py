"""Launching a role's workers and finding them: a role's environment, its launch, the
wait until its workers registered (rendezvous variables, multi-node members, the
experiment config), and looking workers up by id or role (waiting for a role launched
with ``wait=False``)."""

from __future__ import annotations

import os
import time

from corral import name_resolve_keys
from corral import scheduler_keywords as opts
from corral.controller.configure_workers import configure_all
from corral.controller.multinode_instances import start_instances
from corral.controller.parts import ControllerParts
from corral.controller.rendezvous import rendezvous_calls
from corral.controller.role_table import LAUNCHED, REUSED, RoleState
from corral.errors import WorkerNotFoundError
from corral.fdlimit import ensure_fds, is_fd_exhaustion, too_many_files
from corral.launcher import LaunchRequest
from corral.multinode import Instance, nodes_of
from corral.safedirs import make_private_subdir
from corral.spec import NormalizedJob, SchedulingSpec, Worker
from corral.stop_deadline import STOP_DEADLINE_ENV, check_stop_deadline
from corral.worker import env as E


def worker_env(c: ControllerParts, role: str, index: int, spec: SchedulingSpec) -> dict[str, str]:
    """The environment every backend gives a worker process."""
    by_launcher = not c.launcher.shares_filesystem  # it hands the secret over itself
    return E.worker_environment(
        experiment=c.experiment,
        trial=c.trial,
        role=role,
        index=index,
        name_resolve=c.name_resolve.describe(),
        log_dir=c.paths.log_dir,
        port_count=spec.port_count,
        lease_timeout=c.lease_timeout,
        cpu=spec.cpu,
        run_id=c.run_id,
        fileroot=c.settings.fileroot,
        secret_file=None if by_launcher else c.secret_file,
        engines=spec.engines,
        env_vars=spec.env_vars,
        offload=c.settings.enable_tms_offload,
        outlive=c.outlive,
    )


def check_job(c: ControllerParts, job: NormalizedJob) -> None:
    """ConfigError (field, value, fix) if ``job`` cannot become a role here."""
    check_stop_deadline(dict(os.environ), f"environment variable {STOP_DEADLINE_ENV}")
    c.table.check_new(job, c.n_gpus_per_node, c.launcher, c.backend)


def hold_lease(c: ControllerParts) -> None:
    """Claim the trial for this run before anything starts (corral.controller.trial_hold)."""
    if not c.hold.held:
        c.removed_leftovers = c.hold.hold()


def launch_role(c: ControllerParts, job: NormalizedJob, wait: bool = True) -> list[str]:
    ensure_fds(job.replicas * c.launcher.fds_per_worker, f"role {job.role!r}")
    hold_lease(c)
    c.name_resolve.clear_subtree(c.key(name_resolve_keys.role_prefix, job.role))
    envs = [worker_env(c, job.role, i, spec) for i, spec in enumerate(job.tasks)]
    make_private_subdir(c.paths.log_dir)  # 0700, like every directory below
    c.progress(
        f"starting {job.replicas} {job.role} worker(s) on {c.backend}; logs in {c.paths.log_dir}"
    )
    try:
        c.launcher.launch(LaunchRequest(job=job, envs=envs, log_dir=c.paths.log_dir))
        c.table.roles[job.role] = RoleState(job, [], LAUNCHED, pending=True)
        if wait:
            finish_role(c, job.role, c.startup_timeout)
    except BaseException as exc:
        c.table.roles.pop(job.role, None)
        c.teardown.stop_launched(job.role)
        if is_fd_exhaustion(exc):
            import resource

            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            needed = job.replicas * c.launcher.fds_per_worker
            raise too_many_files(f"role {job.role!r}", needed, soft, hard) from exc
        raise
    return [f"{job.role}/{i}" for i in range(job.replicas)]


def finish_role(c: ControllerParts, role: str, timeout: float) -> None:
    """Wait until a launched role's workers registered, then give them their
    rendezvous variables and (with an ``exp_config``) configure them."""
    state = c.table.roles.get(role)
    if state is None or not state.pending:
        return
    started = time.monotonic()
    workers = c.watch.await_registration(role, state.job.replicas, timeout)
    rendezvous = rendezvous_calls(c, role, workers)
    if c.exp_config is not None:  # with the rendezvous: one round trip to each worker
        c.io.run(configure_all(c.caller, workers, c.exp_config, along=rendezvous))
    else:
        c.io.run(c.caller.acall_all(rendezvous))
    k = nodes_of(state.job.tasks[0], c.n_gpus_per_node)
    if k > 1:  # multi-node instances: their members, and everyone's node variables
        state.instances, members = start_instances(
            workers,
            k,
            lambda name, n: c.watch.await_registration(name, n, timeout),
            lambda envs: c.io.run(
                c.caller.acall_all([(w, "/set_env", {"env": e}) for w, e in envs])
            ),
        )
        c.table.add_workers(members)
    state.workers, state.pending = workers, False
    c.table.add_workers(workers)
    c.progress(f"{len(workers)} {role} worker(s) ready in {time.monotonic() - started:.2f}s")


def worker(c: ControllerParts, worker_id: str) -> Worker:
    """The worker by id; a worker of a role launched with ``wait=False`` is waited for."""
    found = c.table.ids.get(worker_id)  # the common case, in one look-up
    if found is not None and not c.table.unrestartable:
        return found
    if worker_id not in c.table.ids and worker_id not in c.table.unrestartable:
        state = c.table.roles.get(str(worker_id).rpartition("/")[0])
        if state is not None and state.pending:
            with c.lock:
                finish_role(c, state.job.role, c.startup_timeout)
    return c.table.worker(worker_id)


def get_workers(c: ControllerParts, role: str, timeout: float | None = None) -> list[Worker]:
    """The role's workers once ready (see ``Scheduler.get_workers``)."""
    state = c.table.state(role)
    opts.check_number("timeout", timeout)
    wait = c.startup_timeout if timeout is None else timeout
    if state.kind == REUSED:
        finish_role(c, state.target, wait)
        state.workers = list(c.table.roles[state.target].workers)
    with c.lock:
        finish_role(c, role, wait)
    c.watch.raise_if_dead(state)
    return list(state.workers)


def worker_ids(c: ControllerParts, role: str) -> list[str]:
    return [w.id for w in get_workers(c, role)]


def instance(c: ControllerParts, worker_id: str) -> Instance:
    """A multi-node worker's instance (see ``Scheduler.instance``)."""
    found = c.table.worker(worker_id)
    state = c.table.state(found.role)
    if not state.instances:
        raise WorkerNotFoundError(
            worker_id, f"{worker_id} is not a multi-node worker (gpu <= n_gpus_per_node)"
        )
    return state.instances[found.index]
