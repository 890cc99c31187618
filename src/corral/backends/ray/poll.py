"""Which replicas of a role died, and why: the actors' pending ``wait_forever`` calls
(resolved when an actor ends), dead raylets and draining nodes (NodeWatch), dead members
of multi-node instances, and with ``requeue=True`` the replicas lost with their node and
not yet back (NodeLossRequeue)."""

from __future__ import annotations

from corral.backends.ray.node_loss import NODE_LOST, NodeLossRequeue, node_lost
from corral.backends.ray.nodes import NodeWatch
from corral.backends.ray.state import RayState, Replica
from corral.launcher import WorkerExit
from corral.logs import replica_log_path
from corral.multinode import NODE_RANK, member_role


def death_reason(exc: BaseException) -> str:
    """Ray's death cause, without its generic troubleshooting paragraph."""
    lines = [line.strip() for line in str(exc).splitlines()]
    detail = {}
    kept = []
    for line in lines:
        key, sep, value = line.partition(": ")
        if sep and key in ("class_name", "actor_id", "pid", "name", "namespace", "ip"):
            detail[key] = value
        elif line:
            kept.append(line)
    text = " ".join(kept)
    cut = text.find(" Some common causes include")
    if cut > 0:
        text = text[:cut]
    where = ", ".join(f"{k} {detail[k]}" for k in ("name", "pid", "ip") if k in detail)
    return f"Ray actor died ({where}): {text}" if where else f"Ray actor died: {text}"


class ReplicaPoll:
    """``Launcher.poll`` of the Ray backend; records each exit on its replica."""

    def __init__(self, state: RayState, nodes: NodeWatch, node_loss: NodeLossRequeue):
        self.state = state
        self.nodes = nodes
        self.node_loss = node_loss

    def poll(self, role: str) -> dict[int, WorkerExit]:
        ray = self.state.ray
        replicas = self.state.records(role)
        live = [r for r in replicas if r.exit is None]
        if live and not ray.is_initialized():
            for r in live:  # the driver's actors went with its runtime
                r.exit = WorkerExit(
                    f"Ray actor {r.name} is gone: ray.shutdown() was called in this process"
                )
        elif live:
            self._raylets_lost(live)
            live = [r for r in live if r.exit is None]
        if live and ray.is_initialized():
            ready, _ = ray.wait([r.done_ref for r in live], num_returns=len(live), timeout=0)
            ready_ids = {ref.hex() for ref in ready}
            for r in live:
                if r.done_ref.hex() in ready_ids:
                    self._record(r, self._exit_of(r))
        dead = {r.index: r.exit for r in replicas if r.exit is not None}
        for index, exit_ in self._member_deaths(role).items():
            dead.setdefault(index, exit_)
        if self.state.requeue:
            dead.update(self.node_loss.still_lost(role))
        return dead

    def _record(self, replica: Replica, exit_: WorkerExit) -> None:
        """The replica's first exit stays (the monitor and a call may poll at once); a
        main worker preempted by it is brought back."""
        with self.state.lock:
            first, replica.exit = replica.exit is None, replica.exit or exit_
        if first and exit_.preempted and replica.parent is None:
            self.node_loss.bring_back(replica)

    def _raylets_lost(self, live: list[Replica]) -> None:
        """Warn replicas on draining nodes; end those whose raylet died (with
        ``requeue=True`` that is a lost node: preempted, brought back)."""
        requeue = self.state.requeue
        for i, exit_ in self.nodes.check(live).items():
            exit_.preempted = requeue
            exit_.reason += NODE_LOST if requeue else ""
            self._record(live[i], exit_)

    def _exit_of(self, replica: Replica) -> WorkerExit:
        ray = self.state.ray
        log_path = replica_log_path(replica.log_dir, replica.role, replica.index)
        try:
            reason = ray.get(replica.done_ref, timeout=5)
            return WorkerExit(f"Ray actor {replica.name} {reason}", None, log_path)
        except ray.exceptions.RayActorError as exc:
            if self.state.requeue and node_lost(exc):
                return WorkerExit(death_reason(exc) + NODE_LOST, None, log_path, preempted=True)
            return WorkerExit(death_reason(exc), None, log_path)
        except Exception as exc:
            return WorkerExit(f"Ray actor {replica.name} is gone: {exc}", None, log_path)

    def _member_deaths(self, role: str) -> dict[int, WorkerExit]:
        """Instances of ``role`` with a dead member: the member's node and why."""
        members = member_role(role)
        if members not in self.state.forks:
            return {}
        dead: dict[int, WorkerExit] = {}
        for index, exit_ in sorted(self.poll(members).items()):
            replica = next(r for r in self.state.records(members) if r.index == index)
            instance = replica.parent[1]
            try:
                node = self.state.info(replica, 1.0).get("node_id", "?")
            except Exception:
                node = "?"
            rank = int(replica.env.get(NODE_RANK, "0"))
            dead.setdefault(
                instance,
                WorkerExit(
                    f"member {members}/{index} on node {node} (node rank {rank}) died: "
                    f"{exit_.reason}",
                    exit_.exit_code,
                    exit_.log_path,
                ),
            )
        return dead
