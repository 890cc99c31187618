"""Where a ping-pong's two ends run, fixed for corral and its baseline alike.

A loopback request/reply costs ~17 us when both ends share a CPU (the reply wakes its
reader with a plain switch) and ~45-70 us when they run on two CPUs (a cross-CPU wake-up
each way). Left to the kernel, the raw echo server lands on either from one run to the
next, so its p50 flipped between the two while corral's worker mostly ran on the other
CPU: the ratio measured placement, not corral. ``placed`` pins this process (the client)
and every thread of the server processes for a block of measurements, and puts the old
affinities back after it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

PLACEMENTS = ("two_cpus", "one_cpu")


def cpus_for(placement: str) -> tuple[int, int] | None:
    """(client CPU, server CPU) for ``placement``; None where this process may use
    fewer than two CPUs (then nothing is pinned)."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        return None
    if placement == "two_cpus":
        return allowed[0], allowed[1]
    if placement == "one_cpu":
        return allowed[0], allowed[0]
    raise ValueError(f"placement {placement!r}: expected one of {PLACEMENTS}")


def _threads(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except FileNotFoundError:
        return []


@contextlib.contextmanager
def placed(placement: str, server_pids: list[int]) -> Iterator[bool]:
    """Pin the client and the servers' threads as ``placement`` says for the block;
    yields whether they were pinned."""
    cpus = cpus_for(placement)
    if cpus is None:
        yield False
        return
    client_cpu, server_cpu = cpus
    saved = {0: os.sched_getaffinity(0)}
    for pid in server_pids:
        for tid in _threads(pid):
            saved[tid] = os.sched_getaffinity(tid)
    try:
        os.sched_setaffinity(0, {client_cpu})
        for tid in saved:
            if tid:
                os.sched_setaffinity(tid, {server_cpu})
        yield True
    finally:
        for tid, cpus_before in saved.items():
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(tid, cpus_before)
