"""What the whole live view costs (issues 25 and 26): the noop call and the async fan-out
in a trial with the view on (the default: the call recorder, the controller's stats
thread writing the snapshot once a second and reading the workers' CPU/memory records,
each worker measuring its process tree every 5 s) against a trial with it off
(``CORRAL_STATS=0`` in the controller's and the workers' environment).

``stats_overhead.py`` swaps the recorder inside one trial, so the stats thread and the
workers' reports run on both sides; here each side is its own controller process, run
in alternating rounds (on, off, off, on, ...) so both see the same load.

Rows: ``local.noop.view_overhead`` (p50 with the view / p50 without; target <= 1.1x) and
``local.fanout.view_overhead`` (calls/s without / with).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time

from common import Row, Target, log, median, percentile, rounded

NAME = "local"
HERE = os.path.dirname(os.path.abspath(__file__))


def _child(seconds: float, fan_n: int) -> dict:
    """One trial, 4 workers: noop calls for ``seconds`` (long enough for several stats
    snapshots and CPU/memory reports), then fan-out gathers for as long."""
    from corral import Job
    from corral.backends.local import LocalScheduler
    from corral.config import BaseExperimentConfig

    root = tempfile.mkdtemp(prefix="corral-view-", dir="/tmp")
    cfg = BaseExperimentConfig(experiment_name="view", trial_name=f"t{os.getpid()}")
    sched = LocalScheduler(exp_config=cfg, gpu_devices=[], fileroot=root, progress=lambda t: 0)
    try:
        ids = sched.create_workers(Job(role="main", replicas=4))
        for wid in ids:
            asyncio.run(sched.create_engine(wid, "corral.testing.engines.EchoEngine"))
        for _ in range(200):  # warm: connections open
            sched.call_engine(ids[0], "noop")
        lat = []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            started = time.perf_counter()
            sched.call_engine(ids[0], "noop")
            lat.append((time.perf_counter() - started) * 1e3)

        async def fan() -> list[float]:
            rates = []
            stop = time.monotonic() + seconds
            while time.monotonic() < stop or len(rates) < 2:
                started = time.perf_counter()
                await asyncio.gather(
                    *(sched.async_call_engine(ids[i % len(ids)], "noop") for i in range(fan_n))
                )
                rates.append(fan_n / (time.perf_counter() - started))
            return rates

        return {"lat": lat, "rates": asyncio.run(fan())}
    finally:
        sched.close()
        import shutil

        shutil.rmtree(root, ignore_errors=True)


def _round(view_on: bool, seconds: float, fan_n: int) -> dict:
    env = {**os.environ, "CORRAL_STATS": "1" if view_on else "0"}
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", str(seconds), str(fan_n)],
        env=env, capture_output=True, text=True, timeout=600, cwd=HERE,
    )  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"view_overhead child failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench(quick: bool) -> list[Row]:
    rounds, seconds, fan_n = (2, 3.0, 400) if quick else (4, 8.0, 2000)
    lat: dict[str, list[float]] = {"on": [], "off": []}
    rates: dict[str, list[float]] = {"on": [], "off": []}
    for r in range(rounds):
        for mode in ("on", "off") if r % 2 == 0 else ("off", "on"):
            got = _round(mode == "on", seconds, fan_n)
            lat[mode] += got["lat"]
            rates[mode] += got["rates"]
    p50 = {m: percentile(v, 50) for m, v in lat.items()}
    log(
        f"view overhead: noop p50 {p50['on']:.4f} ms with the view, {p50['off']:.4f} ms "
        f"without; fan-out {median(rates['on']):.0f}/s with, {median(rates['off']):.0f}/s "
        f"without ({rounds} alternating rounds of each)"
    )
    note = "one controller process per round, CORRAL_STATS=1 (view on) or 0 (off), alternating"
    return [
        Row(
            key=f"{NAME}.noop.view_overhead",
            backend=NAME,
            label="noop call_engine p50 with the whole live view on (stats, snapshots, CPU/memory)",
            unit="ms",
            value=p50["on"],
            baseline=p50["off"],
            baseline_label="the same calls in a trial with CORRAL_STATS=0",
            targets=[Target("ratio", "<=", 1.1, "<= 1.1x without the view")],
            samples={
                "corral": rounded(lat["on"][:2000], 4),
                "baseline": rounded(lat["off"][:2000], 4),
            },
            extra={
                "p99_ms": {m: round(percentile(v, 99), 4) for m, v in lat.items()},
                "calls": {m: len(v) for m, v in lat.items()},
                "note": note,
            },
        ),
        Row(
            key=f"{NAME}.fanout.view_overhead",
            backend=NAME,
            label=f"async fan-out ({fan_n} calls) with the whole live view on",
            unit="calls/s",
            value=median(rates["on"]),
            baseline=median(rates["off"]),
            baseline_label="the same gathers in a trial with CORRAL_STATS=0",
            higher_is_better=True,
            targets=[Target("ratio", "<=", 1.1, "<= 1.1x without the view")],
            samples={"corral": rounded(rates["on"], 1), "baseline": rounded(rates["off"], 1)},
            extra={"note": note},
        ),
    ]


def main() -> None:
    """``python benchmarks/view_overhead.py [--quick]``: just these rows."""
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(_child(float(sys.argv[2]), int(sys.argv[3]))))
        return
    for row in bench("--quick" in sys.argv):
        row.finish()
        print(f"{row.key}: {row.value:.4f} vs {row.baseline:.4f} {row.unit}, ratio {row.ratio:.3f}")


if __name__ == "__main__":
    main()
