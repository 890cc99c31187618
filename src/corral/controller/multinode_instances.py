"""The controller's side of multi-node instances (corral.multinode): waiting for each
instance's members, giving every process of an instance its node variables, and
``Scheduler.instance(worker_id)``, the documented way to reach the member nodes."""

from __future__ import annotations

from collections.abc import Callable

from corral.multinode import Instance, member_role
from corral.spec import Worker


def head_of(worker: Worker) -> tuple[str, int]:
    """The instance's rendezvous address: its worker's IP and last reserved port (with
    ``port_count >= 3`` it differs from the role's ``MASTER_PORT``)."""
    ports = worker.reserved_ports
    return worker.ip, (ports[-1] if ports else worker.port)


def start_instances(
    workers: list[Worker],
    k: int,
    await_members: Callable[[str, int], list[Worker]],
    set_envs: Callable[[list[tuple[Worker, dict[str, str]]]], None],
) -> tuple[list[Instance], list[Worker]]:
    """Wait for the members of ``workers`` (k nodes each), list each worker's member
    hosts on it, and give every process its node variables. Returns the instances and
    all member workers."""
    role = workers[0].role
    members = await_members(member_role(role), len(workers) * (k - 1))
    instances, envs = [], []
    for i, worker in enumerate(workers):
        mine = members[i * (k - 1) : (i + 1) * (k - 1)]
        worker.member_hosts = [m.host for m in mine]
        instance = Instance(
            worker, tuple(mine), (worker.host, *worker.member_hosts), head_of(worker)
        )
        instances.append(instance)
        envs.append((worker, instance.env(0)))
        envs += [(m, instance.env(rank)) for rank, m in enumerate(mine, start=1)]
    set_envs(envs)
    return instances, members
