"""A pipelined chain broadcast over a process group, with torch.distributed's own
point-to-point calls (``send``/``recv`` of the group's backend; no transport of corral's).

Gloo's ``broadcast`` sends the whole message from the source to every other rank, so N
receivers cost N transfers over the source's link. Here rank ``src`` sends to the next
rank, which forwards each chunk to the one after while it receives the next: about one
transfer plus one chunk per hop, as NCCL's ring does on GPUs (``backend="nccl"`` keeps
torch's own broadcast).
"""

from __future__ import annotations

from typing import Any

#: bytes per chunk of the chain (``CORRAL_CHAIN_CHUNK`` to change)
CHUNK = 4 << 20
#: at most this many forwarded chunks in flight per rank before waiting for the oldest
IN_FLIGHT = 8


def order(world_size: int, src: int) -> list[int]:
    """The chain: ``src`` first, then the other ranks in rank order."""
    return [src] + [r for r in range(world_size) if r != src]


def chunks(tensor: Any, size: int) -> list:
    """Byte views of a contiguous tensor, ``size`` bytes each (the last one shorter)."""
    flat = tensor.view(-1).view(_uint8())
    return [flat[i : i + size] for i in range(0, flat.numel(), size)]


def _uint8() -> Any:
    import torch

    return torch.uint8


def broadcast(group: Any, rank: int, world_size: int, tensors: list, src: int, size: int) -> None:
    """Every rank calls this with tensors of the same shapes; on return they hold
    ``src``'s values. ``group`` is the torch backend (``ProcessGroupGloo``)."""
    chain = order(world_size, src)
    place = chain.index(rank)
    before = chain[place - 1] if place else None
    after = chain[place + 1] if place + 1 < len(chain) else None
    pending: list = []
    for tensor in tensors:
        work_on = tensor if tensor.is_contiguous() else tensor.contiguous()
        for piece in chunks(work_on, size):
            if before is not None:
                group.recv([piece], before, 0).wait()
            if after is not None:
                pending.append(group.send([piece], after, 0))
                if len(pending) >= IN_FLIGHT:
                    pending.pop(0).wait()
        if work_on is not tensor:
            tensor.copy_(work_on)
    for work in pending:
        work.wait()
