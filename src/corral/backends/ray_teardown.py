"""Stopping on Ray: a role's actors (and the children forked next to them) are stopped,
killed and waited for until Ray reports them dead and their groups removed."""

from __future__ import annotations

import socket
import time
from typing import Any

from corral.backends.ray_groups import GONE_TIMEOUT_SECONDS
from corral.backends.ray_start import _Replica
from corral.launcher import WorkerExit
from corral.procs import pid_alive

STOP_GRACE_SECONDS = 3.0


class RayTeardown:
    """Mixin of RayLauncher: ``stop`` and ``close``, and the teardown they share."""

    def stop(self, role: str, reverse: bool = False) -> None:
        """Every actor of the role at once (Ray gives no order among them)."""
        self._node_loss.forget(role)
        with self._lock:
            record = self._roles.pop(role, None)
            doomed = []
            for fork_role, forks in list(self._forks.items()):
                mine = [r for r in forks.replicas if r.parent and r.parent[0] == role]
                if mine:
                    doomed.extend(mine)
                    forks.replicas = [r for r in forks.replicas if r not in mine]
                    if not forks.replicas:
                        self._forks.pop(fork_role, None)
        if record is None and not doomed:
            return
        replicas = doomed + (record.replicas if record else [])
        self._teardown(replicas, record.pgs if record else [])

    def _teardown(self, replicas: list[_Replica], pgs: list[Any]) -> None:
        ray = self.ray
        if not ray.is_initialized():
            return  # the runtime is gone, and its actors and groups with it
        from ray.util.placement_group import remove_placement_group

        nodes = self._node_watch()
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
        self._wait_groups_gone([pg for pg in pgs if id(pg) not in lost_groups], deadline)
        while pids and time.monotonic() < deadline:
            pids = [p for p in pids if pid_alive(p)]
            if pids:
                time.sleep(0.02)

    def _wait_actors_dead(self, replicas: list[_Replica], deadline: float) -> None:
        """Until Ray reports each killed actor dead (then its name is free again): a call
        made after ``ray.kill`` fails with RayActorError once the kill has landed."""
        ray = self.ray
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
        for role in list(self._forks):
            with self._lock:
                record = self._forks.pop(role, None)
            if record:
                self._teardown(record.replicas, [])
        for role in list(self._roles):
            self.stop(role)
        if self.started_runtime and self.ray is not None and self.ray.is_initialized():
            self.ray.shutdown()
        self.started_runtime = False
