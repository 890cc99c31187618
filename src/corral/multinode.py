"""Multi-node instances: one worker that holds ``k`` whole nodes (``gpu = k *
n_gpus_per_node``), for an inference server that spans nodes (TP x PP over 2 nodes).

The worker runs on the instance's first node (node rank 0); each other node runs a
*member*: a corral worker of role ``<role>.members`` (index ``i * (k - 1) + r - 1`` for
node rank ``r`` of instance ``i``), on which an engine starts the server's per-node
process. Every process of an instance gets the variables multi-node servers rendezvous
with (SGLang's ``--nnodes/--node-rank/--dist-init-addr``, vLLM's
``--nnodes/--node-rank/--master-addr/--master-port``): :data:`NNODES`,
:data:`NODE_RANK`, :data:`HEAD_ADDR`, :data:`HEAD_PORT` (a free port reserved on the
head). This module is the arithmetic; the backends place the nodes (docs/shapes.md)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from corral.errors import ConfigError, GPURequestError
from corral.spec import NormalizedJob, SchedulingSpec, Worker

MEMBER_SUFFIX = ".members"
NNODES = "CORRAL_NNODES"
NODE_RANK = "CORRAL_NODE_RANK"
HEAD_ADDR = "CORRAL_HEAD_ADDR"
HEAD_PORT = "CORRAL_HEAD_PORT"


@dataclass(frozen=True)
class Instance:
    """Worker ``index`` of a multi-node role as the controller knows it."""

    worker: Worker
    members: tuple[Worker, ...]
    hosts: tuple[str, ...]
    """Node names, node rank 0 (the worker's) first."""
    head: tuple[str, int]

    @property
    def nnodes(self) -> int:
        return len(self.hosts)

    def env(self, node_rank: int) -> dict[str, str]:
        """The rendezvous variables of the process on node ``node_rank``."""
        return {
            NNODES: str(self.nnodes),
            NODE_RANK: str(node_rank),
            HEAD_ADDR: self.head[0],
            HEAD_PORT: str(self.head[1]),
        }


def nodes_of(spec: SchedulingSpec, n_gpus_per_node: int) -> int:
    """How many whole nodes one worker of ``spec`` holds (1 unless multi-node)."""
    if n_gpus_per_node <= 0 or spec.gpu <= n_gpus_per_node:
        return 1
    return spec.gpu // n_gpus_per_node if spec.gpu % n_gpus_per_node == 0 else 0


def check_multinode(job: NormalizedJob, n_gpus_per_node: int, backend: str, supported: bool) -> int:
    """Nodes per worker of ``job`` (1: an ordinary role); refuses a spec that is larger
    than a node but not a whole number of nodes, one whose cpu/mem do not divide by the
    nodes, and any multi-node spec on a backend that cannot place one."""
    counts = set()
    for i, spec in enumerate(job.tasks):
        k = nodes_of(spec, n_gpus_per_node)
        if k == 0:
            lower = (spec.gpu // n_gpus_per_node) * n_gpus_per_node
            raise GPURequestError(
                f"job.tasks[{i}].gpu",
                spec.gpu,
                f"a worker cannot use more GPUs than a node has (n_gpus_per_node="
                f"{n_gpus_per_node}) unless it holds whole nodes: {spec.gpu} = "
                f"{spec.gpu / n_gpus_per_node:g} x {n_gpus_per_node}; use gpu="
                f"{lower or n_gpus_per_node} or {lower + n_gpus_per_node} (a multi-node "
                "instance), or at most one node's GPUs",
                job.role,
            )
        counts.add(k)
        if k > 1 and not supported:
            raise GPURequestError(
                f"job.tasks[{i}].gpu",
                spec.gpu,
                f"a multi-node instance ({k} x {n_gpus_per_node} GPUs) needs several hosts; "
                f"the {backend} backend runs on one host: use gpu <= {n_gpus_per_node}, or "
                "RayScheduler / SlurmScheduler",
                job.role,
            )
        if k > 1 and spec.max_restarts:
            raise ConfigError(
                f"job.tasks[{i}].max_restarts",
                spec.max_restarts,
                "multi-node instances are not restarted yet (their members would not be); use 0",
            )
        for name in ("cpu", "mem"):
            value = getattr(spec, name)
            if k > 1 and value % k:
                raise ConfigError(
                    f"job.tasks[{i}].{name}",
                    value,
                    f"a {k}-node instance takes {name}/{k} on each node, but {value} % {k} = "
                    f"{value % k}; use a multiple of {k}",
                )
    if len(counts) > 1:
        raise ConfigError(
            "job.tasks[*].gpu",
            sorted(t.gpu for t in job.tasks),
            "give every worker of a role the same number of nodes",
        )
    return counts.pop()


def per_node(spec: SchedulingSpec, k: int) -> SchedulingSpec:
    """The share of one node of a ``k``-node worker: gpu, cpu and mem divided by k."""
    if k <= 1:
        return spec
    return dataclasses.replace(spec, gpu=spec.gpu // k, cpu=spec.cpu // k, mem=spec.mem // k)


def member_role(role: str) -> str:
    return role + MEMBER_SUFFIX


def member_index(instance: int, node_rank: int, k: int) -> int:
    """The member index of node rank ``node_rank`` (>= 1) of instance ``instance``."""
    return instance * (k - 1) + node_rank - 1


def member_place(index: int, k: int) -> tuple[int, int]:
    """(instance, node rank) of member ``index``."""
    return index // (k - 1), index % (k - 1) + 1
