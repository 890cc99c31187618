"""Process groups across roles, for weight sync: the engine's side.

The controller creates a named group over workers of several roles
(``Scheduler.create_process_group("weights", roles=["trainer/0", "rollout"])``); corral
does the rendezvous (a ``TCPStore`` on the first member's host, a free port, the world
size, the timeout) and every member builds its own ``torch.distributed`` process group.
An engine method then gets it by name::

    from corral.groups import process_group

    def update_weights(self):
        pg = process_group("weights")
        pg.broadcast_state_dict(self.model.state_dict(), src=0)   # in place on receivers

The group is **not** the default group: a trainer keeps its own data-parallel
``init_process_group``; this one is a separate ``ProcessGroupGloo`` (or
``ProcessGroupNCCL`` with ``backend="nccl"``, tensors on ``cuda``) over a ``PrefixStore``.
Use it with its helpers below, with its own methods (``pg.group.broadcast([t], opts)``), or
with ``torch.distributed``'s functions by **group rank**:
``dist.broadcast(t, group=pg.group, group_src=0)``.

Importing this module costs nothing; torch is imported when a group is built.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

from corral.errors import ProcessGroupError

__all__ = ["GROUPS", "ProcessGroup", "ProcessGroupError", "group_names", "process_group"]

#: the groups of this worker process, by name (``corral.groups.member`` fills it)
GROUPS: dict[str, ProcessGroup] = {}


class ProcessGroup:
    """One member's handle on a named cross-role group."""

    def __init__(
        self,
        name: str,
        rank: int,
        world_size: int,
        group: Any,
        backend: str,
        members: list[str],
        store: Any = None,
        same_host: bool = False,
    ):
        self.name = name
        self.rank = rank  #: this worker's rank in the group (role by role, then index)
        self.world_size = world_size
        self.group = group  #: the torch.distributed ProcessGroup (Gloo or NCCL)
        self.backend = backend
        self.members = list(members)  #: worker ids, by rank
        self.store = store  #: the PrefixStore of the group (tests, advanced use)
        #: every member on this host (agreed at join): gloo broadcasts use shared memory
        self.same_host = same_host and backend == "gloo"
        #: how the last ``broadcast`` moved its bytes: "shm", "shm, placed", "chain", "torch"
        self.last_path = ""
        self._shared: Any = None  # corral.groups.samehost.SharedBroadcast, built on first use

    @property
    def device(self) -> str:
        """Where tensors must be for this group's collectives: ``cuda`` for NCCL."""
        return "cuda" if self.backend == "nccl" else "cpu"

    def rank_of(self, worker_id: str) -> int:
        return self.members.index(worker_id)

    def _dist(self) -> Any:
        import torch.distributed as dist

        return dist

    def broadcast(self, tensors: Any, src: int = 0) -> Any:
        """Broadcast, in place, a tensor, a list of tensors or a dict of them (by sorted
        key) from group rank ``src``; every member passes tensors of the same shapes and
        dtypes. Returns ``tensors``. A gloo group whose members all share one host moves
        the bytes through one private shared-memory segment (``corral.groups.samehost``:
        one copy in, one copy out per receiver, receivers in parallel); other gloo groups of
        3 or more relay them down a pipelined chain (``corral.groups.chain``: about one
        transfer, not one per receiver); NCCL uses its own broadcast."""
        items = _tensor_list(tensors)
        if self.same_host:
            shared = self._shared_broadcast()
            shared.broadcast(self.group, self.rank, items, src)
            placed = self.rank == src and not shared.copied
            self.last_path = "shm, placed" if placed else "shm"
            return tensors
        if self.backend == "gloo" and self.world_size > 2:
            from corral.groups import chain

            size = int(os.environ.get("CORRAL_CHAIN_CHUNK", chain.CHUNK))
            chain.broadcast(self.group, self.rank, self.world_size, items, src, size)
            self.last_path = "chain"
            return tensors
        dist = self._dist()
        for tensor in items:
            dist.broadcast(tensor, group=self.group, group_src=src)
        self.last_path = "torch"
        return tensors

    def place(self, tensors: list) -> list:
        """For a source that broadcasts the same tensors again and again (a trainer's
        parameters): copies of ``tensors`` placed in this member's shared-memory segment,
        to use instead of them (``p.data = view``); a same-host broadcast of them then
        costs the source no copy (``last_path == "shm, placed"``). Without the same-host
        path it returns ``tensors`` themselves. Dtypes and shapes are kept."""
        if not self.same_host:
            return list(tensors)
        return self._shared_broadcast().place(list(tensors))

    def _shared_broadcast(self) -> Any:
        from corral.groups.samehost import SharedBroadcast

        if self._shared is None:
            self._shared = SharedBroadcast()
        return self._shared

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """A picklable object from rank ``src`` (others pass anything, e.g. None)."""
        box = [obj]
        with warnings.catch_warnings():  # torch warns that the group is a bare backend
            warnings.filterwarnings("ignore", message="You are using a Backend")
            self._dist().broadcast_object_list(box, group=self.group, group_src=src)
        return box[0]

    def broadcast_state_dict(self, state_dict: dict | None = None, src: int = 0) -> dict:
        """Rank ``src``'s state dict on every member. Receivers passing a dict with the
        same keys get it filled in place; receivers passing None get new CPU/CUDA tensors
        (shapes and dtypes come from ``src`` first). Returns the dict."""
        import torch

        mine = self.rank == src
        spec = None
        if mine:
            spec = {k: (tuple(v.shape), str(v.dtype)) for k, v in state_dict.items()}
        spec = self.broadcast_object(spec, src)
        if state_dict is None:
            state_dict = {
                k: torch.empty(shape, dtype=getattr(torch, dtype.removeprefix("torch.")))
                for k, (shape, dtype) in spec.items()
            }
        elif set(state_dict) != set(spec):
            raise ProcessGroupError(
                f"broadcast_state_dict on group {self.name!r}: rank {self.rank} has keys "
                f"{sorted(set(state_dict) ^ set(spec))[:5]} that rank {src} does not share; "
                "pass the same keys, or None to receive new tensors"
            )
        moved = {k: v if v.device.type == self.device else v.to(self.device)
                 for k, v in state_dict.items()}  # fmt: skip
        self.broadcast(moved, src)
        for k, v in moved.items():
            if v is not state_dict[k]:
                state_dict[k].copy_(v)
        return state_dict

    def barrier(self) -> None:
        import torch

        self.broadcast(torch.zeros(1, device=self.device), 0)

    def close(self) -> None:
        """Drop this member's shared-memory segment or mapping (the group is being destroyed)."""
        if self._shared is not None:
            self._shared.close()
            self._shared = None

    def __repr__(self) -> str:
        return f"ProcessGroup({self.name!r}, rank {self.rank}/{self.world_size}, {self.backend})"


def _tensor_list(tensors: Any) -> list:
    if isinstance(tensors, dict):
        return [tensors[k] for k in sorted(tensors)]
    if isinstance(tensors, list | tuple):
        return list(tensors)
    return [tensors]


def process_group(name: str) -> ProcessGroup:
    """This worker's handle on the group ``name`` (made by the controller's
    ``create_process_group``). Raises ProcessGroupError naming the groups it has."""
    try:
        return GROUPS[name]
    except KeyError:
        raise ProcessGroupError(
            f"this worker is in no process group named {name!r} (it is in "
            f"{sorted(GROUPS) or 'none'}); create it from the controller with "
            f"sched.create_process_group({name!r}, roles=[...]) including this worker's role"
        ) from None


def group_names() -> list[str]:
    return sorted(GROUPS)
