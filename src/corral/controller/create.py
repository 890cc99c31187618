"""``create_workers``: a new role's workers launched (processes of their own), reusing
a target role's workers (colocation), or forked next to them; with ``dry_run`` the
launch is printed instead."""

from __future__ import annotations

from typing import Any

from corral.controller.dryrun import plan
from corral.controller.forking import fork_role
from corral.controller.launch import check_job, finish_role, launch_role
from corral.controller.parts import ControllerParts
from corral.controller.role_table import REUSED, RoleState
from corral.spec import normalize_job


def create_workers(c: ControllerParts, job: Any, wait: bool = True) -> list[str]:
    if c.dry_run:
        print(plan(c, normalize_job(job)))
        return []
    nj = normalize_job(job)
    with c.lock:
        check_job(c, nj)
        if nj.is_colocated:
            finish_role(c, nj.strategy.target, c.startup_timeout)
        if nj.is_colocated and not nj.strategy.fork:
            target = c.table.roles[nj.strategy.target]
            c.table.roles[nj.role] = RoleState(nj, list(target.workers), REUSED, nj.strategy.target)
            return [w.id for w in target.workers]
        if nj.is_colocated:
            return fork_role(c, nj, nj.strategy.target)
        return launch_role(c, nj, wait)
