"""What the live view costs in the controller (issues 25 and 26): the noop call and the
async fan-out with the view on (the call recorder, and the stats thread that builds and
writes the snapshot once a second and reads the workers' CPU/memory records) against
the view off (the recorder swapped for ``NullCallStats`` and the stats thread stopped),
in alternating windows on the same 4 workers, so both sides see the same load.

``stats_overhead.py`` swaps only the recorder (the stats thread runs on both sides). A
comparison of whole trials (one controller process with ``CORRAL_STATS=1``, one with
``0``, in alternating rounds) was tried first: on the shared 2-core machine one round's
fan-out varied 7.7k-20k calls/s, far wider than the effect, so windows of a few seconds
in one process are used. What runs in the workers (each measures its process tree
every 5 s, ``corral.worker.usage``) is timed on its own and logged.

Rows: ``local.noop.view_overhead`` (p50 with the view / p50 without; target <= 1.1x) and
``local.fanout.view_overhead`` (calls/s without / with).
"""

from __future__ import annotations

import asyncio
import os
import time

from common import Row, Target, log, median, percentile, rounded

NAME = "local"


def _view(sched, on: bool, recorders) -> None:
    """Turn the controller's view on (recorder + stats thread) or off."""
    sched.parts.caller.stats = recorders[0] if on else recorders[1]
    if on:
        sched.parts.stats.calls = recorders[0]
        sched.parts.stats.start()
    else:
        sched.parts.stats.stop()


def _worker_reading_ms() -> float:
    from corral.worker.usage import TreeMeter

    meter = TreeMeter(os.getpid())
    meter.read()
    started = time.process_time()
    for _ in range(20):
        meter.read()
    return (time.process_time() - started) / 20 * 1e3


def bench(sched, ids: list[str], quick: bool) -> list[Row]:
    from corral.observe.call_stats import NullCallStats

    reps, window, fan_n = (4, 0.5, 400) if quick else (12, 1.5, 2000)
    recorders = (sched.parts.stats.calls, NullCallStats())
    lat: dict[str, list[float]] = {"on": [], "off": []}
    rates: dict[str, list[float]] = {"on": [], "off": []}

    async def gather_once() -> float:
        started = time.perf_counter()
        await asyncio.gather(
            *(sched.async_call_engine(ids[i % len(ids)], "noop") for i in range(fan_n))
        )
        return fan_n / (time.perf_counter() - started)

    async def fan() -> None:
        await gather_once()
        for rep in range(reps):
            for mode in ("on", "off") if rep % 2 == 0 else ("off", "on"):
                _view(sched, mode == "on", recorders)
                end = time.monotonic() + window
                while time.monotonic() < end:
                    rates[mode].append(await gather_once())

    try:
        for rep in range(reps):
            for mode in ("on", "off") if rep % 2 == 0 else ("off", "on"):
                _view(sched, mode == "on", recorders)
                end = time.monotonic() + window
                while time.monotonic() < end:
                    started = time.perf_counter()
                    sched.call_engine(ids[0], "noop")
                    lat[mode].append((time.perf_counter() - started) * 1e3)
        asyncio.run(fan())
    finally:
        _view(sched, True, recorders)
    p50 = {m: percentile(v, 50) for m, v in lat.items()}
    reading = _worker_reading_ms()
    log(
        f"view overhead: noop p50 {p50['on']:.4f} ms with the view, {p50['off']:.4f} ms "
        f"without; fan-out {median(rates['on']):.0f}/s with, {median(rates['off']):.0f}/s "
        f"without; a worker's CPU/memory reading {reading:.2f} ms of CPU every 5 s"
    )
    note = (
        f"alternating {window}s windows, {reps} of each: recorder + stats thread on / off; "
        f"in each worker, a CPU/memory reading costs {reading:.2f} ms of CPU every 5 s"
    )
    return [
        Row(
            key=f"{NAME}.noop.view_overhead",
            backend=NAME,
            label="noop call_engine p50 with the live view on (recorder, snapshots, usage reads)",
            unit="ms",
            value=p50["on"],
            baseline=p50["off"],
            baseline_label="the same calls with the recorder off and the stats thread stopped",
            targets=[Target("ratio", "<=", 1.1, "<= 1.1x without the view")],
            samples={
                "corral": rounded(lat["on"][:2000], 4),
                "baseline": rounded(lat["off"][:2000], 4),
            },
            extra={
                "p99_ms": {m: round(percentile(v, 99), 4) for m, v in lat.items()},
                "worker_reading_ms": round(reading, 3),
                "note": note,
            },
        ),
        Row(
            key=f"{NAME}.fanout.view_overhead",
            backend=NAME,
            label=f"async fan-out ({fan_n} calls) with the live view on",
            unit="calls/s",
            value=median(rates["on"]),
            baseline=median(rates["off"]),
            baseline_label="the same gathers with the recorder off and the stats thread stopped",
            higher_is_better=True,
            targets=[Target("ratio", "<=", 1.1, "<= 1.1x without the view")],
            samples={"corral": rounded(rates["on"], 1), "baseline": rounded(rates["off"], 1)},
            extra={"note": note},
        ),
    ]


def main() -> None:
    """``python benchmarks/view_overhead.py [--quick]``: just these rows, 4 workers."""
    from common import run_alone_on_echo_workers

    run_alone_on_echo_workers(bench, "view")


if __name__ == "__main__":
    main()
