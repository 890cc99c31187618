"""Broadcast through one shared-memory segment when every member of a gloo group shares
the source's host: the source copies its tensors once into a private memfd, each receiver
copies them once out of it, all receivers at the same time. Over loopback TCP the same
bytes would be copied into the kernel and out again on every hop.

The group's own collectives carry the control: a 6-value header broadcast (the segment's
pid, descriptor, size, capacity, name tag and a checksum of the dtypes and shapes), then an all-reduce that is both the "every
receiver has its copy" barrier (the source may write the segment again) and the error
flag (a receiver that failed makes every member raise, none hangs).

Security is ``corral.rpc.shm``'s: the segment is a memfd created 0600, reachable only
through ``/proc/<pid>/fd/<n>`` (same user, ptrace-read rule); a receiver checks that the
descriptor names the announced random memfd, owned by its own uid with no group/other
permission bits, before it maps it (shared, read-only). Whether the group takes this path
is decided once, at join, by every member from the same store keys
(``corral.groups.member``): all members publish ``shm.host_token()``, and the path is on
only if all tokens are equal and non-empty (``CORRAL_SHM=0`` on any member turns it off).
"""

from __future__ import annotations

import mmap
import os
import warnings
import zlib
from typing import Any

from corral.errors import ProcessGroupError

#: alignment of each tensor in the segment (any dtype's itemsize divides it)
ALIGN = 64


def layout(tensors: list) -> tuple[list[tuple[int, int]], int]:
    """``(offset, nbytes)`` of each tensor in the segment, and the bytes used in all."""
    spans, pos = [], 0
    for t in tensors:
        n = t.numel() * t.element_size()
        spans.append((pos, n))
        pos += -(-n // ALIGN) * ALIGN
    return spans, pos


def spec_tag(tensors: list) -> int:
    """A checksum of the tensors' dtypes and shapes: sender and receivers must agree."""
    return zlib.crc32(repr([(str(t.dtype), tuple(t.shape)) for t in tensors]).encode())


def _tag(name: str) -> int:
    return int.from_bytes(bytes.fromhex(name.removeprefix("corral-")), "big", signed=True)


def _name(tag: int) -> str:
    return "corral-" + int(tag).to_bytes(8, "big", signed=True).hex()


def _bytes_of(buffer: Any) -> Any:
    import torch

    with warnings.catch_warnings():  # a read-only mapping: torch warns, we only read it
        warnings.filterwarnings("ignore", message="The given buffer is not writable")
        return torch.frombuffer(buffer, dtype=torch.uint8)


def _as(buf: Any, span: tuple[int, int], like: Any) -> Any:
    off, n = span
    return buf[off : off + n].view(like.dtype).view(like.shape)


def open_shared(pid: int, fd: int, name: str, capacity: int) -> mmap.mmap:
    """Map another process's memfd, shared and read-only, after checking that it is the
    announced corral segment, this user's and private (0600)."""
    from corral.rpc.shm import open_private_memfd

    local = open_private_memfd(pid, fd, name, capacity, ProcessGroupError)
    try:
        return mmap.mmap(local, capacity, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    finally:
        os.close(local)


class SharedBroadcast:
    """One member's side: the segment it writes as a source, the mapping it reads as a
    receiver (both kept between calls: no page faults after the first broadcast)."""

    def __init__(self) -> None:
        self.segment: Any = None  # corral.rpc.shm.Segment, when this member was a source
        self.copied = True  # did this member's last broadcast as a source copy its tensors
        self.placed: Any = None  # the Segment that ``place`` put tensors in (never scratch)
        self.mapped: dict[tuple[int, int, str], tuple[Any, Any]] = {}  # -> (mmap, bytes)

    def _source_bytes(self, total: int) -> Any:
        from corral.rpc import shm

        if self.segment is None or self.segment.capacity < total:
            if self.segment is not None:
                self.segment.close()
            self.segment = shm.Segment(max(total, ALIGN))
        return _bytes_of(self.segment.map)

    def place(self, tensors: list) -> list:
        """Copies of ``tensors`` that live in a segment of their own, at the offsets a
        broadcast of these tensors uses: broadcasting them later costs the source no copy.
        A later ``place`` makes a new segment (the old views stay valid)."""
        import torch

        from corral.rpc import shm

        spans, total = layout(tensors)
        self.placed = shm.Segment(max(total, ALIGN))
        buf = _bytes_of(self.placed.map)
        views = []
        with torch.no_grad():
            for t, span in zip(tensors, spans, strict=True):
                view = _as(buf, span, t)
                view.copy_(t)
                views.append(view)
        return views

    def _in_place(self, tensors: list, spans: list) -> bool:
        """Do ``tensors`` already lie in the placed segment, each at its offset?"""
        if self.placed is None:
            return False
        base = _bytes_of(self.placed.map).data_ptr()
        return all(
            t.is_contiguous() and t.device.type == "cpu" and t.data_ptr() == base + off
            for t, (off, _n) in zip(tensors, spans, strict=True)
        )

    def _receiver_bytes(self, pid: int, fd: int, name: str, capacity: int) -> Any:
        key = (pid, fd, name)
        if key not in self.mapped:
            while len(self.mapped) >= 4:  # the oldest: a segment the source replaced
                self.mapped.pop(next(iter(self.mapped)))
            mapping = open_shared(pid, fd, name, capacity)
            self.mapped[key] = (mapping, _bytes_of(mapping))
        return self.mapped[key][1]

    def broadcast(self, group: Any, rank: int, tensors: list, src: int) -> None:
        import torch
        import torch.distributed as dist

        spans, total = layout(tensors)
        spec = spec_tag(tensors)
        header = torch.zeros(6, dtype=torch.int64)
        if rank == src:
            seg = self.placed
            if not self._in_place(tensors, spans):
                buf = self._source_bytes(total)
                with torch.no_grad():
                    for t, span in zip(tensors, spans, strict=True):
                        _as(buf, span, t).copy_(t)
                seg = self.segment
            self.copied = seg is self.segment
            header = torch.tensor([os.getpid(), seg.fd, total, seg.capacity, _tag(seg.name), spec])
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = src, 0
        group.broadcast([header], opts).wait()
        failed: Exception | None = None
        if rank != src:
            try:
                pid, fd, size, capacity, tag, their_spec = (int(v) for v in header)
                if size != total or their_spec != spec:
                    raise ProcessGroupError(
                        f"broadcast: rank {rank} passed {len(tensors)} tensors of {total} bytes "
                        f"whose dtypes/shapes differ from the source rank {src}'s ({size} "
                        "bytes); pass tensors of the same shapes and dtypes, in the same order"
                    )
                buf = self._receiver_bytes(pid, fd, _name(tag), capacity)
                with torch.no_grad():
                    for t, span in zip(tensors, spans, strict=True):
                        t.copy_(_as(buf, span, t))
            except Exception as exc:  # still join the barrier below: nobody hangs
                failed = exc
        flag = torch.tensor([0 if failed is None else 1], dtype=torch.int64)
        group.allreduce([flag]).wait()  # barrier: every receiver has its copy
        if failed is not None:
            raise failed
        if int(flag[0]):
            raise ProcessGroupError(
                f"broadcast from rank {src}: {int(flag[0])} receiver(s) failed to read the "
                "shared-memory segment (their error is raised on their side)"
            )

    def close(self) -> None:
        self.mapped = {}
        for seg in (self.segment, self.placed):
            if seg is not None:
                seg.close()
        self.segment = self.placed = None
