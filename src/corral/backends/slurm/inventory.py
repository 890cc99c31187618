"""Slurm: what the cluster has in total, and queue reasons that can never clear.

A role that asks for more nodes than its partition has, or more GPUs per node than any
node has, is refused before ``sbatch`` (sinfo is read once per launcher). A submitted job
that Slurm keeps PENDING for a reason no amount of waiting fixes (``PartitionNodeLimit``,
``ReqNodeNotAvail`` for nodes that do not exist, ...) is cancelled and refused within a
poll, instead of waiting out ``startup_timeout``.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field

from corral.backends.slurm.resource_names import SlurmResources, read_resources, resource_problem

#: Pending reasons that no amount of waiting clears (the job's request exceeds what the
#: partition or association allows, or names things that do not exist).
NEVER_CLEARS = {
    "PartitionNodeLimit": "the job asks for more nodes than the partition allows",
    "PartitionTimeLimit": "the job's time limit exceeds the partition's",
    "PartitionConfig": "the request does not match the partition's configuration",
    "BadConstraints": "the job's constraints cannot be met by any node",
    "InvalidAccount": "the account does not exist or is not allowed",
    "InvalidQOS": "the QOS does not exist or is not allowed",
}


@dataclass
class Partition:
    name: str
    nodes: dict[str, int] = field(default_factory=dict)  # node -> GPUs (gres gpu)
    default: bool = False


def _gpus(gres: str) -> int:
    total = 0
    for item in gres.split(","):
        m = re.match(r"gpu(?::[^:(]+)?:(\d+)", item.strip())
        if m:
            total += int(m.group(1))
    return total


def read_inventory(run) -> dict[str, Partition] | None:
    """Partitions with their nodes and GPUs, from ``sinfo``; None if sinfo fails."""
    try:
        r = run(["sinfo", "-h", "-N", "-o", "%N|%P|%G"], timeout=10)
    except Exception:
        return None
    if r.returncode != 0:
        return None
    parts: dict[str, Partition] = {}
    for line in r.stdout.splitlines():
        fields = line.strip().split("|")
        if len(fields) < 3:
            continue
        node, pname, gres = fields
        default = pname.endswith("*")
        pname = pname.rstrip("*")
        part = parts.setdefault(pname, Partition(pname))
        part.default = part.default or default
        part.nodes[node] = _gpus(gres)
    return parts


def fit_problem(
    inventory: dict[str, Partition] | None,
    partition: str | None,
    nodes: int,
    gpus_per_node: int,
) -> tuple[str, object, str] | None:
    """(field, value, fix) if ``nodes`` x ``gpus_per_node`` can never run, else None."""
    if not inventory:
        return None
    if partition is None:
        part = next((p for p in inventory.values() if p.default), None)
        if part is None:
            return None
    else:
        part = inventory.get(partition)
        if part is None:
            return (
                "partition",
                partition,
                f"Slurm has no such partition (partitions: {', '.join(sorted(inventory))})",
            )
    if nodes > len(part.nodes):
        return (
            "nodes",
            nodes,
            f"the role needs {nodes} node(s) but partition {part.name} has "
            f"{len(part.nodes)} in total; lower replicas or gpu per worker",
        )
    if gpus_per_node and not any(g >= gpus_per_node for g in part.nodes.values()):
        most = max(part.nodes.values(), default=0)
        return (
            "gres",
            f"gpu:{gpus_per_node}",
            f"no node of partition {part.name} has {gpus_per_node} GPUs (the most is "
            f"{most}); lower gpu per worker or set n_gpus_per_node={most}",
        )
    return None


def never_clears(reason: str, inventory: dict[str, Partition] | None) -> str | None:
    """Why a job pending for ``reason`` can never start, or None if it may still start."""
    word = reason.split(",")[0].strip()
    if word in NEVER_CLEARS:
        return f"{word}: {NEVER_CLEARS[word]}"
    if word == "ReqNodeNotAvail" and inventory is not None:
        m = re.search(r"UnavailableNodes:(\S+)", reason)
        known = {n for p in inventory.values() for n in p.nodes}
        if m:
            missing = [n for n in _expand(m.group(1)) if n not in known]
            if missing:
                return f"ReqNodeNotAvail: node(s) {', '.join(missing)} do not exist"
    return None


def _expand(hostlist: str) -> list[str]:
    try:
        r = subprocess.run(
            ["scontrol", "show", "hostnames", hostlist], capture_output=True, text=True, timeout=5
        )
        if r.returncode == 0:
            return r.stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        pass
    return hostlist.split(",")


class ClusterFacts:
    """What the cluster has, read once per launcher (``sinfo``, ``scontrol show
    reservation``) on the first check: whether a role can ever be placed, and whether a
    queue reason can ever clear. ``inventory = {}`` skips the node and GPU checks."""

    def __init__(self, run: Callable) -> None:
        self.run = run
        self.inventory: dict[str, Partition] | None = None
        self.resources: SlurmResources | None = None

    def placement_problem(
        self,
        partition: str | None,
        constraint: str | None,
        reservation: str | None,
        nodes: int,
        gpus_per_node: int,
    ) -> tuple[str, object, str] | None:
        """(field, value, why) if a role of ``nodes`` x ``gpus_per_node`` with these
        names can never be placed, else None."""
        if self.inventory is None:
            self.inventory = read_inventory(self.run) or {}
        if self.resources is None:
            self.resources = read_resources(self.run) or SlurmResources()
        return resource_problem(self.resources, partition, constraint, reservation) or fit_problem(
            self.inventory, partition, nodes, gpus_per_node
        )

    def never_clears(self, reason: str) -> str | None:
        """Why a job pending for ``reason`` can never start, or None."""
        return never_clears(reason, self.inventory)
