"""Adoption: a new controller re-attaches to a running trial and adopts its workers (opt-in).

By default a trial's workers exit as soon as their controller is gone (its pid on the
same host, or its lease no longer renewed): fail-fast cleanup. With
``Scheduler(..., outlive_controller=SECONDS)`` the controller writes that grace period
in its lease; when it dies or exits without ``close()`` (crash, SIGKILL, a lost shell),
its workers keep running for ``lease_timeout + SECONDS``. Within that time a new
controller made with ``attach=True`` (same experiment, trial and fileroot) takes the run
over: it keeps the run id and the trial secret, reads the registered workers, and the
backend adopts their processes or jobs (``Launcher.adopt``). Calls, the health monitor,
``delete_workers`` and ``close`` then work as on a controller that launched them.
``corral ps/logs/stop`` work on such a trial from any shell meanwhile.

What an attached controller does not know: each role's original ``SchedulingSpec`` (its
roles get a plain spec, so ``max_restarts`` is 0 and ``scale`` repeats the plain spec)
and, on the local backend, the exit codes of adopted processes (not its children).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from corral import name_resolve_keys
from corral.auth import TrialKeys, open_record
from corral.capabilities import require
from corral.controller.parts import ControllerParts
from corral.controller.role_table import FORKED, LAUNCHED, RoleState
from corral.controller.run_lease import Lease, read_lease, registered_workers
from corral.discovery import NameResolve
from corral.errors import ConfigError, TrialInUseError
from corral.spec import NormalizedJob, SchedulingSpec, SchedulingStrategy, Worker


@dataclass
class Attachable:
    """A dead controller's run that can be taken over: its lease and its secret."""

    lease: Lease
    secret: str


def check_grace(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ConfigError(
            "outlive_controller",
            value,
            "use seconds >= 0 (0: workers exit with their controller; N: they wait N s "
            "for a controller made with attach=True)",
        )
    return float(value)


def find_run(
    nr: NameResolve, experiment: str, trial: str, secret_file: str, lease_timeout: float
) -> Attachable:
    """The run a new controller attaches to, or an error naming why there is none."""
    lease = read_lease(nr, experiment, trial)
    where = f"{experiment}/{trial}"
    if lease is None:
        raise ConfigError(
            "attach", True, f"no run of {where} is running here (no controller lease); "
            "start one without attach=True"
        )  # fmt: skip
    if lease.alive(lease_timeout):
        raise TrialInUseError(
            f"cannot attach to {where}: its controller is alive ({lease.describe()}); "
            f"stop it first, or `corral stop {experiment} {trial}`",
            holder=lease,
        )
    if lease.grace <= 0:
        raise ConfigError(
            "attach", True, f"run {lease.run_id} of {where} did not ask its workers to "
            "outlive their controller (outlive_controller=0), so they exited with it; "
            "start a new run without attach=True"
        )  # fmt: skip
    age = time.time() - lease.t
    if age > lease_timeout + lease.grace + 1.0:
        raise ConfigError(
            "attach", True, f"run {lease.run_id} of {where} lost its controller {age:.0f}s "
            f"ago, past its grace period ({lease_timeout:g}s + {lease.grace:g}s): its "
            "workers have exited; start a new run without attach=True"
        )  # fmt: skip
    try:
        with open(secret_file) as fh:
            secret = fh.read().strip()
    except OSError as exc:
        raise ConfigError(
            "attach", True, f"cannot read the trial secret {secret_file} ({exc.strerror}); "
            "attach from the same user and fileroot as the run"
        ) from None  # fmt: skip
    stored = nr.get(name_resolve_keys.controller_key(experiment, trial)) or ""
    signed = open_record(
        TrialKeys(secret), name_resolve_keys.controller_key(experiment, trial), stored
    )
    if signed is None or Lease.parse(signed) != lease:
        raise ConfigError(
            "attach", True, f"the controller lease of {where} is not signed with the trial's "
            "secret: someone else wrote it (forged); nothing was adopted"
        )  # fmt: skip
    return Attachable(lease, secret)


def take_over(c: ControllerParts, run: Attachable) -> list[str]:
    """Take over the run's lease and registered workers; returns the roles taken over.
    The backend's part for it is ``launcher.adoption`` (corral.capabilities)."""
    adoption = require(c.launcher, "adoption", "re-attach to running workers", "attach", True)
    found = registered_workers(c.name_resolve, c.experiment, c.trial)
    by_role: dict[str, list[Worker]] = {}
    for worker_id in sorted(found, key=lambda k: (k.rpartition("/")[0], _index(k))):
        role, _, index = worker_id.rpartition("/")
        if not index.isdigit():
            continue
        worker = c.watch.read_worker(role, int(index))  # signed with the run's secret
        if worker is not None:
            by_role.setdefault(role, []).append(worker)
    c.hold.hold(attach=True)
    for role, workers in by_role.items():
        workers = [w for i, w in enumerate(workers) if w.index == i]  # 0..n-1 only
        job = NormalizedJob(
            role, len(workers), tuple(SchedulingSpec() for _ in workers), SchedulingStrategy()
        )
        kind = FORKED if all(w.forked for w in workers) else LAUNCHED
        if kind == LAUNCHED:
            adoption.adopt(role, workers, c.paths.log_dir)
        c.table.roles[role] = RoleState(job, workers, kind)
        c.table.add_workers(workers)
    roles = ", ".join(f"{r} ({len(w)})" for r, w in by_role.items()) or "none"
    c.progress(
        f"attached to run {run.lease.run_id} of {c.experiment}/{c.trial} "
        f"(its controller pid {run.lease.pid} is gone); roles: {roles}"
    )
    return list(by_role)


def detach(c: ControllerParts) -> None:
    """At the controller's exit without close(): leave the workers running for the grace
    period (the lease stays, no longer renewed) and say how to attach or stop them."""
    c.closed = True
    c.monitor.stop()
    c.hold.lease.release(delete=False)
    c.progress(
        f"controller pid {os.getpid()} exits; the workers of {c.experiment}/"
        f"{c.trial} wait {c.lease_timeout + c.outlive:g}s for a "
        "controller made with attach=True (or `corral stop "
        f"{c.experiment} {c.trial}`)"
    )


def _index(worker_id: str) -> int:
    tail = worker_id.rpartition("/")[2]
    return int(tail) if tail.isdigit() else -1
