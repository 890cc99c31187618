"""The torch.distributed variables of a role's workers, and handing them over."""

from __future__ import annotations

from corral.controller.parts import ControllerParts
from corral.spec import Worker


def rendezvous_envs(workers: list[Worker], master: tuple[str, int] | None) -> list[dict[str, str]]:
    """``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` (rank among the workers of the same host)
    and, if known, ``MASTER_ADDR``/``MASTER_PORT`` for each worker, in rank order."""
    hosts: dict[str, int] = {}
    envs = []
    for rank, worker in enumerate(workers):
        local_rank = hosts.get(worker.host, 0)
        hosts[worker.host] = local_rank + 1
        env = {"RANK": str(rank), "WORLD_SIZE": str(len(workers)), "LOCAL_RANK": str(local_rank)}
        if master is not None:
            env.update(MASTER_ADDR=master[0], MASTER_PORT=str(master[1]))
        envs.append(env)
    return envs


def rendezvous_calls(
    c: ControllerParts, role: str, workers: list[Worker], only: list[int] | None = None
) -> list[tuple[Worker, str, dict]]:
    """The ``/set_env`` requests that give each worker its torch.distributed variables
    (``only``: just these ranks), as ``Caller.acall_all`` takes them."""
    master = c.launcher.rendezvous_master(role, workers)
    pairs = list(zip(workers, rendezvous_envs(workers, master), strict=True))
    if only is not None:
        pairs = [pairs[i] for i in only]
    pairs = [(w, env) for w, env in pairs if not w.foreign]  # corral.foreign: its own API
    return [(w, "/set_env", {"env": env}) for w, env in pairs]


def give_rendezvous(
    c: ControllerParts, role: str, workers: list[Worker], only: list[int] | None = None
) -> None:
    """Give each worker its torch.distributed variables (``only``: just these ranks)."""
    c.io.run(c.caller.acall_all(rendezvous_calls(c, role, workers, only)))
