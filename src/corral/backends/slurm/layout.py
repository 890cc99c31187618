"""How a role's identical workers map onto Slurm nodes (nodes, tasks per node, CPUs,
memory, GPUs), and the check that a role's replicas are alike (one ``srun`` step)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from corral.errors import ConfigError
from corral.multinode import nodes_of, per_node
from corral.spec import SchedulingSpec, validate_spec

# spec fields that mean nothing to Slurm and may differ between replicas
_NOT_SLURM_FIELDS = frozenset({"ray_placement_strategy", "ray_resources", "accelerator_type"})


@dataclass(frozen=True)
class SlurmLayout:
    """How ``replicas`` identical workers map onto Slurm nodes."""

    nodes: int
    ntasks: int
    ntasks_per_node: int
    cpus_per_task: int
    gpus_per_task: int
    gpus_per_node: int
    """GPUs requested on every node (``--gres=gpu:<n>``); 0 for CPU-only roles."""
    mem_per_node_gb: int
    """``--mem`` per node in GiB; 0 means no ``--mem`` line."""
    nodes_per_worker: int = 1
    """A multi-node instance's whole nodes (corral.multinode): one task per node, the
    worker's on the first, a member's on each other."""


def plan_layout(
    replicas: int,
    spec: SchedulingSpec,
    n_gpus_per_node: int,
    *,
    n_cpus_per_node: int | None = None,
    mem_per_node_gb: int | None = None,
) -> SlurmLayout:
    """Nodes and tasks per node for a role, or a ConfigError for shapes Slurm cannot run.

    ``nodes = max(1, ceil(replicas * gpu / n_gpus_per_node))`` and
    ``ntasks_per_node = ceil(replicas / nodes)``. CPU-only roles use one node.
    ``n_cpus_per_node`` and ``mem_per_node_gb``, when given, are checked too.
    A spec with ``cpu=0`` gets one CPU per task (Slurm's minimum).
    """
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise ConfigError("job.replicas", replicas, "use a whole number >= 1")
    if (
        isinstance(n_gpus_per_node, bool)
        or not isinstance(n_gpus_per_node, int)
        or n_gpus_per_node < 0
    ):
        raise ConfigError(
            "n_gpus_per_node", n_gpus_per_node, "use a whole number >= 0 (GPUs on one node)"
        )
    validate_spec(spec)
    gpu = spec.gpu
    if gpu > 0 and n_gpus_per_node == 0:
        raise ConfigError(
            "SchedulingSpec.gpu",
            gpu,
            "the cluster is configured with n_gpus_per_node=0; set n_gpus_per_node to the "
            "GPUs of one node or use gpu=0",
        )
    k = nodes_of(spec, n_gpus_per_node)
    if k > 1:  # one task per node, k nodes per worker
        for name in ("cpu", "mem"):
            if getattr(spec, name) % k:
                value = getattr(spec, name)
                raise ConfigError(
                    f"SchedulingSpec.{name}",
                    value,
                    f"a {k}-node worker takes {name}/{k} on each node, but {value} % {k} = "
                    f"{value % k}; use a multiple of {k}",
                )
        node = per_node(spec, k)
        return SlurmLayout(
            nodes=replicas * k,
            ntasks=replicas * k,
            ntasks_per_node=1,
            cpus_per_task=max(1, node.cpu),
            gpus_per_task=node.gpu,
            gpus_per_node=node.gpu,
            mem_per_node_gb=node.mem,
            nodes_per_worker=k,
        )
    if gpu > n_gpus_per_node:
        raise ConfigError(
            "SchedulingSpec.gpu",
            gpu,
            f"one worker spans nodes only with whole nodes: use gpu <= n_gpus_per_node="
            f"{n_gpus_per_node} or a multiple of it",
        )

    total_gpus = replicas * gpu
    nodes = max(1, math.ceil(total_gpus / n_gpus_per_node)) if gpu > 0 else 1
    ntasks_per_node = math.ceil(replicas / nodes)
    gpus_per_node = ntasks_per_node * gpu
    if gpus_per_node > n_gpus_per_node:
        fits = n_gpus_per_node // gpu
        lower = (replicas // fits) * fits
        choices = " or ".join(str(r) for r in (lower, lower + fits) if r >= 1)
        raise ConfigError(
            "job.replicas",
            replicas,
            f"{replicas} workers x {gpu} GPUs do not pack onto nodes of {n_gpus_per_node} "
            f"GPUs: Slurm would need {ntasks_per_node} workers ({gpus_per_node} GPUs) on each "
            f"of {nodes} nodes; use a multiple of {fits} replicas ({choices}) or a gpu count "
            f"that divides {n_gpus_per_node}",
        )
    cpus_per_task = max(1, spec.cpu)
    if n_cpus_per_node is not None and ntasks_per_node * cpus_per_task > n_cpus_per_node:
        raise ConfigError(
            "SchedulingSpec.cpu",
            spec.cpu,
            f"{ntasks_per_node} workers x {cpus_per_task} CPUs share one node but a node has "
            f"{n_cpus_per_node} CPUs; use cpu <= {n_cpus_per_node // ntasks_per_node} or fewer "
            "replicas",
        )
    mem_node = ntasks_per_node * spec.mem
    if mem_per_node_gb is not None and mem_node > mem_per_node_gb:
        raise ConfigError(
            "SchedulingSpec.mem",
            spec.mem,
            f"{ntasks_per_node} workers x {spec.mem} GiB share one node but a node has "
            f"{mem_per_node_gb} GiB; use mem <= {mem_per_node_gb // ntasks_per_node} or fewer "
            "replicas",
        )
    return SlurmLayout(
        nodes=nodes,
        ntasks=replicas,
        ntasks_per_node=ntasks_per_node,
        cpus_per_task=cpus_per_task,
        gpus_per_task=gpu,
        gpus_per_node=gpus_per_node,
        mem_per_node_gb=mem_node,
    )


def check_homogeneous(tasks: Sequence[SchedulingSpec]) -> SchedulingSpec:
    """Return the one spec shared by every replica, or raise ConfigError naming the field.

    A Slurm step gives every task the same resources, so one role needs one spec.
    """
    tasks = list(tasks)
    if not tasks:
        raise ConfigError("job.tasks", tasks, "give at least one SchedulingSpec")
    first = tasks[0]
    for i, other in enumerate(tasks[1:], start=1):
        for f in dataclasses.fields(SchedulingSpec):
            if f.name in _NOT_SLURM_FIELDS:
                continue
            a, b = getattr(first, f.name), getattr(other, f.name)
            if a != b:
                raise ConfigError(
                    f"job.tasks[{i}].{f.name}",
                    b,
                    f"Slurm starts every replica of a role in one srun step with the same "
                    f"resources, but tasks[0].{f.name}={a!r}; give every replica the same spec "
                    "or split the role into several roles",
                )
    return first
