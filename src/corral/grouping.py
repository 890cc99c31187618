"""Grouped colocation: a few multi-GPU workers on the GPUs of many smaller ones.

A colocated role (``SchedulingStrategy("colocation", target)``, ``fork=True``) whose
replica count differs from its target's is *grouped* when its GPU demand equals the
target's: ``replicas * gpu == target replicas * target gpu``. The target's GPUs on each
node, in the order of their physical ids, are cut into contiguous, non-overlapping groups
of ``gpu`` devices, one grouped worker per group; each is forked on that node by the
target worker holding the group's first device, and sees exactly its group's devices.
No GPU is reserved a second time: the target's workers keep theirs and the backend's
ledger is not asked (docs/shapes.md). The arithmetic here is pure; ``fork_groups`` starts
the workers through the shared fork path (``POST /fork``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from corral.errors import JobConfigError
from corral.spec import NormalizedJob, Worker

VISIBLE_DEVICE_VARS = ("CUDA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES")


@dataclass(frozen=True)
class TargetSlot:
    """One target worker as grouping sees it: its rank, node and physical device ids."""

    index: int
    node: str
    devices: tuple[str, ...]


@dataclass(frozen=True)
class Group:
    """Grouped worker ``index``: on ``node``, forked by target worker ``host``, seeing
    ``devices``."""

    index: int
    node: str
    host: int
    devices: tuple[str, ...]

    @property
    def visible(self) -> str:
        return ",".join(self.devices)


def is_grouped(job: NormalizedJob, target_replicas: int) -> bool:
    """Is ``job`` a grouped colocation (replica count differs from its target's)?"""
    return job.is_colocated and job.replicas != target_replicas


def check_grouped(job: NormalizedJob, target: NormalizedJob) -> None:
    """Refuse, with the arithmetic and the fix, a grouped shape that can never work
    (before the target's devices are known: totals, fork, one spec)."""
    name, n, g = target.role, target.replicas, target.tasks[0].gpu
    gpus = {t.gpu for t in job.tasks}
    if len(gpus) != 1 or len({t.gpu for t in target.tasks}) != 1:
        raise JobConfigError(
            "job.tasks[*].gpu",
            sorted(gpus),
            "grouped colocation needs one gpu count for every grouped worker and every "
            f"worker of {name!r}",
            job.role,
        )
    gpu = gpus.pop()
    total, have = job.replicas * gpu, n * g
    one_to_one = f"or replicas={n} (one per {name} worker, plain colocation)"
    if not job.strategy.fork:
        raise JobConfigError(
            "job.replicas",
            job.replicas,
            f"Replica count mismatch: fork=False reuses the {n} workers of {name!r} as they "
            f"are, so it needs replicas={n}; use fork=True for grouped colocation",
            job.role,
        )
    if gpu == 0 or g == 0:
        raise JobConfigError(
            "job.replicas",
            job.replicas,
            f"Replica count mismatch: grouped colocation cuts {name!r}'s GPUs into groups, "
            f"but gpu={gpu} per grouped worker and {name!r} has {g} per worker; give both "
            f"GPUs, {one_to_one}",
            job.role,
        )
    if total != have:
        fits = f"replicas={have // gpu} ({have} / {gpu}) " if have % gpu == 0 else ""
        raise JobConfigError(
            "job.replicas",
            job.replicas,
            f"Replica count mismatch: grouped colocation needs equal GPU totals, but "
            f"{job.replicas} x {gpu} = {total} GPUs != {name!r}'s {n} x {g} = {have}; use "
            f"{fits}{one_to_one}",
            job.role,
        )


def plan_groups(job: NormalizedJob, slots: list[TargetSlot]) -> list[Group]:
    """Cut each node's target devices into groups of ``job.tasks[0].gpu``; grouped
    worker indices follow the nodes in the order of the target's ranks."""
    gpu = job.tasks[0].gpu
    nodes: dict[str, list[TargetSlot]] = {}
    for slot in sorted(slots, key=lambda s: s.index):
        nodes.setdefault(slot.node, []).append(slot)
    groups: list[Group] = []
    for node, on_node in nodes.items():
        owned = sorted(
            ((d, s.index) for s in on_node for d in s.devices), key=lambda p: _device_key(p[0])
        )
        if len(owned) % gpu:
            ranks = ", ".join(f"{s.index}:[{','.join(s.devices)}]" for s in on_node)
            raise JobConfigError(
                "job.tasks[0].gpu",
                gpu,
                f"cannot cut node {node}'s {len(owned)} GPUs of {job.strategy.target!r} "
                f"(rank:devices {ranks}) into groups of {gpu}: {len(owned)} % {gpu} = "
                f"{len(owned) % gpu}; use a gpu that divides {len(owned)}, or place "
                f"{job.strategy.target!r} so that each node holds a multiple of {gpu} GPUs",
                job.role,
            )
        for start in range(0, len(owned), gpu):
            chunk = owned[start : start + gpu]
            groups.append(Group(len(groups), node, chunk[0][1], tuple(d for d, _ in chunk)))
    if len(groups) != job.replicas:
        raise JobConfigError(
            "job.replicas",
            job.replicas,
            f"{job.strategy.target!r}'s workers report {sum(len(s.devices) for s in slots)} "
            f"visible GPUs in all, which make {len(groups)} groups of {gpu}, not "
            f"{job.replicas}; the target's workers must see their GPUs "
            "(CUDA_VISIBLE_DEVICES)",
            job.role,
        )
    return groups


def _device_key(device: str) -> tuple[int, str]:
    return (int(device), "") if device.isdigit() else (1 << 30, device)


def slots_of(workers: list[Worker], devices: list[str | None]) -> list[TargetSlot]:
    """Target slots from the workers and the device lists they registered (``gpus``)."""
    return [
        TargetSlot(w.index, w.host or w.ip, tuple(d for d in (seen or "").split(",") if d))
        for w, seen in zip(workers, devices, strict=True)
    ]


def fork_groups(
    fork_one: Callable[[Worker, int, dict[str, str]], Worker],
    job: NormalizedJob,
    groups: list[Group],
    targets: list[Worker],
    fan_out: Callable[[Callable[[Any], Any], list], list],
) -> list[Worker]:
    """Grouped worker i forked next to its group's host, seeing the group's devices.
    ``fork_one(host, index, env)`` is the shared fork (``forking.fork_via_worker``)."""
    by_index = {w.index: w for w in targets}

    def start(group: Group) -> Worker:
        env = dict(job.tasks[group.index].env_vars)
        env.update({name: group.visible for name in VISIBLE_DEVICE_VARS})
        return fork_one(by_index[group.host], group.index, env)

    return fan_out(start, groups)
