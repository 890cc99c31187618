"""Retiring roles: engines destroyed, workers asked to exit, then the backend stops them.

Order matters: a role's dependents (forked or reused roles that live on its workers) go
first; forked workers are stopped by whoever made them (the backend, or their host worker
through ``POST /kill_forked_worker``); launched workers get ``/destroy_engines`` and
``/shutdown`` before the backend's ``stop``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from corral import name_resolve_keys
from corral.controller.caller import Caller
from corral.controller.role_table import FORKED, LAUNCHED, REUSED, RoleTable
from corral.discovery.base import NameResolve
from corral.errors import SchedulerError
from corral.launcher import Launcher
from corral.spec import Worker

log = logging.getLogger("corral")


@dataclass(kw_only=True, eq=False)
class Teardown:
    experiment: str
    trial: str
    name_resolve: NameResolve
    launcher: Launcher
    roles: RoleTable
    caller: Caller
    fan_out: Callable[[Callable[[Any], Any], list], list]
    run_async: Callable[[Any], Any]
    """Runs a coroutine on the controller's I/O loop and returns its result."""
    gone: Callable[[Worker, str], None]
    """Told of each deleted worker and its role (health monitor, data plane)."""

    def delete(self, role: str | None, reverse_order: bool) -> None:
        """``role`` and its dependents, or every role (dependents first). A role that
        does not exist is a warning (as in AReaL). ``reverse_order``: each role's workers
        from the highest rank down (rank 0 last), and roles newest first."""
        table = self.roles.roles
        if role is not None:
            if role not in table:
                log.warning("delete_workers: no role %r to delete; nothing done", role)
                return
            for dependent in [r for r, s in table.items() if s.target == role]:
                self.delete_role(dependent, reverse_order)
            self.delete_role(role, reverse_order)
            return
        order = list(table)
        if reverse_order:
            order.reverse()
        dependents = [r for r in order if table[r].kind != LAUNCHED]
        for name in dependents + [r for r in order if r not in dependents]:
            self.delete_role(name, reverse_order)

    def delete_role(self, role: str, reverse_order: bool = False) -> None:
        state = self.roles.roles.pop(role, None)
        if state is None:
            return
        if state.kind == REUSED:
            return
        members = [m for instance in state.instances for m in instance.members]
        for w in state.workers + members:  # members: of multi-node instances
            self.roles.ids.pop(w.id, None)
            self.roles.unrestartable.pop(w.id, None)
            self.gone(w, role)
        if state.kind == FORKED:
            self.fan_out(
                lambda w: self._kill_forked(w, state.target, state.hosts.get(w.index, w.index)),
                state.workers,
            )
        elif reverse_order:
            for worker in reversed(state.workers):  # one by one: rank 0 last
                self.run_async(self.caller.retire([worker]))
            self.stop_launched(role, reverse_order=True)
        else:
            self.run_async(self.caller.retire(state.workers + members))
            self.stop_launched(role)
        try:
            for name in (role, *{m.role for m in members}):
                self.name_resolve.clear_subtree(
                    name_resolve_keys.role_prefix(self.experiment, self.trial, name)
                )
                for kind in ("_info", "_health", "_usage"):
                    self.name_resolve.clear_subtree(f"{self.experiment}/{self.trial}/{kind}/{name}")
        except Exception as exc:
            log.warning("could not clear name-resolve entries of %s: %s", role, exc)

    def stop_launched(self, role: str, reverse_order: bool = False) -> None:
        try:
            self.launcher.stop(role, reverse=reverse_order)
        except Exception as exc:
            raise SchedulerError(f"stopping the {role} workers failed: {exc}") from exc

    def _destroy_engines(self, worker: Worker) -> None:
        self.caller.quietly(
            worker, "/destroy_engines", 5.0, "destroying engines of", identity=False
        )

    def _kill_forked(self, worker: Worker, target_role: str | None, host: int) -> None:
        self._destroy_engines(worker)

        def via_worker() -> None:  # the host worker (rank ``host`` of the target) stops it
            target = self.roles.roles.get(target_role) if target_role else None
            if target is None or host >= len(target.workers):
                return
            try:
                self.caller.client.request(
                    target.workers[host].address,
                    "/kill_forked_worker",
                    {"worker_id": worker.id},
                    timeout=10.0,
                )
            except Exception as exc:
                log.warning("could not stop forked worker %s: %s", worker.id, exc)

        self.launcher.stop_fork(worker, via_worker)
