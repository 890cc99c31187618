"""Stopping on Ray: a role's actors (and the children forked next to them) are stopped,
killed and waited for until Ray reports them dead and their groups removed."""

from __future__ import annotations

import socket
import time
from typing import Any

from corral.backends.ray.groups import GONE_TIMEOUT_SECONDS, PlacementGroups
from corral.backends.ray.node_loss import NodeLossRequeue
from corral.backends.ray.nodes import NodeWatch
from corral.backends.ray.state import RayState, Replica
from corral.launcher import WorkerExit
from corral.procs import pid_alive

STOP_GRACE_SECONDS = 3.0


class RayTeardown:
    """``stop`` and ``close`` of the launcher, and the teardown they share (also used by
    restart, shrink and forks): takes roles out of the state's tables, removes groups
    through PlacementGroups, leaves dead raylets' replicas to NodeWatch."""

    def __init__(
        self,
        state: RayState,
        groups: PlacementGroups,
        nodes: NodeWatch,
        node_loss: NodeLossRequeue,
    ):
        self.state = state
        self.groups = groups
        self.nodes = nodes
        self.node_loss = node_loss

    def stop(self, role: str, reverse: bool = False) -> None:
        """Every actor of the role at once (Ray gives no order among them)."""
        self.node_loss.forget(role)
        state = self.state
        with state.lock:
            record = state.roles.pop(role, None)
            doomed = []
            for fork_role, forks in list(state.forks.items()):
                mine = [r for r in forks.replicas if r.parent and r.parent[0] == role]
                if mine:
                    doomed.extend(mine)
                    forks.replicas = [r for r in forks.replicas if r not in mine]
                    if not forks.replicas:
                        state.forks.pop(fork_role, None)
        if record is None and not doomed:
            return
        replicas = doomed + (record.replicas if record else [])
        self.teardown(replicas, record.pgs if record else [])

    def teardown(self, replicas: list[Replica], pgs: list[Any]) -> None:
        """Stop these replicas' actors (kill those that do not stop), remove these groups,
        and wait until Ray reports both gone."""
        ray = self.state.ray
        if not ray.is_initialized():
            return  # the runtime is gone, and its actors and groups with it
        from ray.util.placement_group import remove_placement_group

        nodes = self.nodes
        orphaned = [r for r in replicas if nodes.lost(r)]  # Ray can neither stop nor ping
        replicas = [r for r in replicas if r not in orphaned]
        live = [r for r in replicas if r.exit is None]
        stops = []
        for r in live:
            try:
                stops.append(r.actor.stop.remote())
            except Exception:
                pass
        if stops:
            ray.wait(stops, num_returns=len(stops), timeout=STOP_GRACE_SECONDS)
        pids = []
        for r in replicas:
            ready, _ = ray.wait([r.info_ref], timeout=0)
            if ready:
                try:
                    info = ray.get(r.info_ref, timeout=1)
                    if info.get("hostname") == socket.gethostname():
                        pids.append(info["pid"])
                except Exception:
                    pass
            try:
                ray.kill(r.actor, no_restart=True)
            except Exception:
                pass
        for pg in pgs:
            try:
                remove_placement_group(pg)
            except Exception:
                pass
        for r in orphaned:
            try:
                ray.kill(r.actor, no_restart=True)  # the GCS forgets it once the node is dead
            except Exception:
                pass
        deadline = time.monotonic() + GONE_TIMEOUT_SECONDS
        self._wait_actors_dead(replicas, deadline)
        for r in replicas:
            if r.exit is None:
                r.exit = WorkerExit(f"Ray actor {r.name} stopped by the scheduler")
        nodes.end_orphans(orphaned)
        # a dead raylet's node seems to hold its groups' resources until Ray marks it dead
        lost_groups = {id(r.pg) for r in orphaned}
        self.groups.wait_gone([pg for pg in pgs if id(pg) not in lost_groups], deadline)
        while pids and time.monotonic() < deadline:
            pids = [p for p in pids if pid_alive(p)]
            if pids:
                time.sleep(0.02)

    def _wait_actors_dead(self, replicas: list[Replica], deadline: float) -> None:
        """Until Ray reports each killed actor dead (then its name is free again): a call
        made after ``ray.kill`` fails with RayActorError once the kill has landed."""
        ray = self.state.ray
        pending = list(replicas)
        while pending and time.monotonic() < deadline:
            probes = {r.actor.ping.remote(): r for r in pending}
            ready, not_ready = ray.wait(
                list(probes), num_returns=len(probes), timeout=max(0.0, deadline - time.monotonic())
            )
            pending = [probes[ref] for ref in not_ready]
            for ref in ready:
                try:
                    ray.get(ref, timeout=0)
                    pending.append(probes[ref])  # it still answered: the kill is on its way
                except ray.exceptions.RayActorError:
                    pass
                except Exception:
                    pass
            if pending:
                time.sleep(0.02)

    def close(self) -> None:
        """Everything this launcher started, then the runtime if it started it."""
        state = self.state
        for role in list(state.forks):
            with state.lock:
                record = state.forks.pop(role, None)
            if record:
                self.teardown(record.replicas, [])
        for role in list(state.roles):
            self.stop(role)
        if state.started_runtime and state.ray is not None and state.ray.is_initialized():
            state.ray.shutdown()
        state.started_runtime = False
