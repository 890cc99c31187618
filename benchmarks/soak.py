"""Soak: N local workers under sustained async calls (small calls mixed with 16 MiB
payloads) for a fixed time. Counts errors and watches the controller's open file
descriptors and memory. Usage: python benchmarks/soak.py [--workers 32] [--seconds 60]."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import tempfile
import time

import numpy as np

from corral import BaseExperimentConfig, Job, LocalScheduler, SchedulingSpec

ECHO = "corral.testing.engines.EchoEngine"


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def rss_mib() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


async def drive(sched, ids: list[str], seconds: float, big_every: int) -> dict:
    payload = np.ones(4 * 1024 * 1024, dtype=np.float32)  # 16 MiB
    stats = {"calls": 0, "big_calls": 0, "errors": 0, "bytes": 0, "first_error": None}
    deadline = time.monotonic() + seconds
    samples: list[tuple[float, int, float]] = []

    async def loop(wid: str, k: int) -> None:
        n = 0
        while time.monotonic() < deadline:
            n += 1
            try:
                if n % big_every == k % big_every:
                    out = await sched.async_call_engine(wid, "echo", "e", payload)
                    assert out.nbytes == payload.nbytes
                    stats["big_calls"] += 1
                    stats["bytes"] += 2 * payload.nbytes
                else:
                    assert await sched.async_call_engine(wid, "echo", "e", n) == n
                stats["calls"] += 1
            except Exception as exc:  # counted, and the first one kept for the report
                stats["errors"] += 1
                stats["first_error"] = stats["first_error"] or repr(exc)

    async def sampler() -> None:
        while time.monotonic() < deadline:
            samples.append((time.monotonic(), open_fds(), rss_mib()))
            await asyncio.sleep(1.0)

    await asyncio.gather(sampler(), *(loop(w, i) for i, w in enumerate(ids)))
    stats["samples"] = samples
    return stats


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--big-every", type=int, default=20, help="one 16 MiB call in N")
    parser.add_argument("--out", default="benchmarks/results/soak.json")
    args = parser.parse_args()
    resource.setrlimit(
        resource.RLIMIT_NOFILE, (4096, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
    )
    root = tempfile.mkdtemp(prefix="corral-soak-")
    cfg = BaseExperimentConfig(experiment_name="soak", trial_name=f"t{os.getpid()}")
    sched = LocalScheduler(exp_config=cfg, fileroot=root, gpu_devices=[], progress=lambda _t: None)
    try:
        ids = sched.create_workers(Job("soak", args.workers, [SchedulingSpec(cpu=0, port_count=0)]))

        async def setup():
            await asyncio.gather(*(sched.create_engine(w, ECHO, "e") for w in ids))
            for w in ids:
                await sched.async_call_engine(w, "echo", "e", np.ones(4 * 1024 * 1024, np.float32))

        asyncio.run(setup())
        fds0, rss0 = open_fds(), rss_mib()
        t0 = time.monotonic()
        stats = asyncio.run(drive(sched, ids, args.seconds, args.big_every))
        elapsed = time.monotonic() - t0
        fds1, rss1 = open_fds(), rss_mib()
    finally:
        sched.close()
    samples = stats.pop("samples")
    warm = samples[len(samples) // 4] if samples else (0, fds0, rss0)
    result = {
        "workers": args.workers,
        "seconds": round(elapsed, 1),
        "calls": stats["calls"],
        "calls_per_s": round(stats["calls"] / elapsed, 1),
        "big_calls_16MiB": stats["big_calls"],
        "payload_GB_moved": round(stats["bytes"] / 1e9, 2),
        "errors": stats["errors"],
        "first_error": stats["first_error"],
        "controller_fds_start": fds0,
        "controller_fds_end": fds1,
        "controller_fds_max": max(s[1] for s in samples),
        "controller_rss_MiB_start": round(rss0, 1),
        "controller_rss_MiB_end": round(rss1, 1),
        "controller_rss_MiB_after_warmup": round(warm[2], 1),
        "controller_rss_MiB_max": round(max(s[2] for s in samples), 1),
        "bounds": {"fds_growth_max": args.workers, "rss_growth_after_warmup_max_MiB": 64},
    }
    # In-flight 16 MiB payloads make a working set proportional to concurrency; a leak
    # shows as growth after the first quarter of the run.
    result["fds_held"] = result["controller_fds_end"] - fds0 <= args.workers
    result["rss_held"] = result["controller_rss_MiB_end"] - warm[2] <= 64
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=2)
    for k, v in result.items():
        print(f"{k:>36}: {v}")


if __name__ == "__main__":
    main()
