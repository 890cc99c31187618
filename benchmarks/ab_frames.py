"""Binary frames against text heads on the async fan-out, paired in one process.

    python benchmarks/ab_frames.py [--replicas 8] [--calls 4000] [--rounds 8]

One controller, ``--replicas`` local echo workers, two async clients in turn as the
scheduler's: one that offers binary frames on its pipelined connections (``frames``, the
default) and one that sends text heads only (``text``). They alternate gather by gather
(A B B A ...), so both arms see the same background load; each gather is ``--calls``
``async_call_engine`` noops. Printed per arm: the median calls/s, the controller's CPU
time per call (process time) and the workers' (``/proc``).

A diagnostic, not a row of the results table (issue 29, docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--calls", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()

    from corral import Job, SchedulingSpec
    from corral.backends.local import LocalScheduler
    from corral.config import BaseExperimentConfig
    from corral.rpc.async_client import AsyncRPCClient

    fileroot = tempfile.mkdtemp(prefix="corral-ab-frames-", dir="/tmp")
    cfg = BaseExperimentConfig(experiment_name=f"ab-frames-{os.getpid()}", trial_name="t0")
    sched = LocalScheduler(
        exp_config=cfg, gpu_devices=[], fileroot=fileroot, progress=lambda t: None
    )
    try:
        job = Job(role="fan", replicas=args.replicas, tasks=[SchedulingSpec(cpu=1, gpu=0)])
        ids = sched.create_workers(job)
        caller = sched.parts.caller
        secret = sched.parts.secret
        clients = {
            "frames": AsyncRPCClient(secret, frames=True),
            "text": AsyncRPCClient(secret, frames=False),
        }
        pids = sorted({w.pid for w in sched.get_workers("fan") if w.pid})
        n = args.calls

        def workers_cpu() -> float:
            total = 0
            for pid in pids:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rpartition(")")[2].split()
                total += int(fields[11]) + int(fields[12])
            return total / os.sysconf("SC_CLK_TCK")

        async def gather() -> None:
            await asyncio.gather(
                *(sched.async_call_engine(ids[i % len(ids)], "noop") for i in range(n))
            )

        async def run() -> dict:
            await asyncio.gather(
                *(sched.create_engine(w, "corral.testing.engines.EchoEngine") for w in ids)
            )
            figures = {arm: {"rate": [], "ctl": [], "wrk": []} for arm in clients}
            for client in clients.values():  # connections open, frames negotiated
                caller.async_client = client
                await gather()
            for r in range(args.rounds):
                for arm in ("frames", "text") if r % 2 == 0 else ("text", "frames"):
                    caller.async_client = clients[arm]
                    c0, w0, k0 = time.process_time(), time.perf_counter(), workers_cpu()
                    await gather()
                    wall = time.perf_counter() - w0
                    figures[arm]["rate"].append(n / wall)
                    figures[arm]["ctl"].append((time.process_time() - c0) / n * 1e6)
                    figures[arm]["wrk"].append((workers_cpu() - k0) / n * 1e6)
            return figures

        figures = asyncio.run(run())
        for arm, fig in figures.items():
            print(
                f"{arm:6s}: {statistics.median(fig['rate']):8,.0f} calls/s  "
                f"controller CPU {statistics.median(fig['ctl']):5.1f} us/call  "
                f"workers CPU {statistics.median(fig['wrk']):5.1f} us/call"
            )
        gain = statistics.median(figures["frames"]["rate"]) / statistics.median(
            figures["text"]["rate"]
        )
        print(f"frames / text calls per second: {gain:.3f}x (above 1: frames faster)")
        for client in clients.values():
            client.close()
    finally:
        sched.delete_workers()
        sched.close()
        shutil.rmtree(fileroot, ignore_errors=True)


if __name__ == "__main__":
    main()
