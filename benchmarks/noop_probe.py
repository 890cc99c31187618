"""Child process of bench_data: noop call_engine p50 (ms) of whatever corral is on
PYTHONPATH. Usage: python noop_probe.py FILEROOT CALLS"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid

from corral import BaseExperimentConfig, Job, LocalScheduler


def main() -> None:
    fileroot, calls = sys.argv[1], int(sys.argv[2])
    cfg = BaseExperimentConfig(experiment_name="noop-probe", trial_name=uuid.uuid4().hex[:8])
    with LocalScheduler(
        exp_config=cfg, gpu_devices=[], fileroot=fileroot, progress=lambda t: None
    ) as s:
        (wid,) = s.create_workers(Job(role="w", replicas=1))
        asyncio.run(s.create_engine(wid, "corral.testing.engines.EchoEngine"))
        for _ in range(200):
            s.call_engine(wid, "noop")
        lat = []
        for _ in range(calls):
            started = time.perf_counter()
            s.call_engine(wid, "noop")
            lat.append(time.perf_counter() - started)
    lat.sort()
    print(f"{lat[len(lat) // 2] * 1e3:.6f}")


if __name__ == "__main__":
    main()
