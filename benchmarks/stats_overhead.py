"""What the live view's call statistics cost (issue 16): the noop call and the async
fan-out with the controller's per-role recorder on (the default) and off
(``NullCallStats``, the code path before the recorder existed), in alternating blocks
on the same worker so both see the same noise.

Rows: ``local.noop.stats_overhead`` (p50 with stats / p50 without; target <= 1.1x) and
``local.fanout.stats_overhead`` (calls/s without / with).
"""

from __future__ import annotations

import asyncio
import threading
import time

from common import Row, Target, log, median, percentile, rounded

NAME = "local"


def _with(sched, recorder):
    """Swap the scheduler's recorder (the call path, ``sched.parts.caller``, reads its ``stats``
    on every call)."""
    old, sched.parts.caller.stats = sched.parts.caller.stats, recorder
    return old


def bench(sched, ids: list[str], quick: bool) -> list[Row]:
    from corral.observe.call_stats import CallStats, NullCallStats

    blocks, per_block = (6, 200) if quick else (60, 200)
    # 32 alternating gathers per arm: one gather varies by +-10 % on a shared machine, and
    # the hook costs ~1.5 % (docs/benchmarks.md, issue 29): the median needs the samples
    fan_n, fan_reps = (400, 2) if quick else (2000, 32)
    on, off = CallStats(), NullCallStats()
    worker = sched.parts.table.worker(ids[0])

    def bare_noop() -> None:
        """``call_engine``'s body as it was before the hook (issue 16): no recorder at all."""
        payload = {"engine_name": None, "method": "noop", "args": [], "kwargs": {}}
        sched.parts.caller._call(sched.parts.table.worker(worker.id), "/call", payload, None, 2)

    calls = {
        "on": lambda: sched.call_engine(ids[0], "noop"),
        "off": lambda: sched.call_engine(ids[0], "noop"),
        "bare": bare_noop,
    }
    try:
        bare_noop()
    except (
        TypeError,
        AttributeError,
    ):  # the call path's internals moved: compare with the recorder off only
        del calls["bare"]
    lat: dict[str, list[float]] = {mode: [] for mode in calls}
    modes = list(calls)
    for block in range(blocks):
        for mode in modes if block % 2 == 0 else modes[::-1]:
            previous = _with(sched, on if mode == "on" else off)
            call = calls[mode]
            try:
                for _ in range(per_block):
                    started = time.perf_counter()
                    call()
                    lat[mode].append((time.perf_counter() - started) * 1e3)
            finally:
                _with(sched, previous)
        on.sample()  # as the stats thread does once a second: the window stays small

    async def gather_once(sample: bool = False) -> float:
        """``sample``: also close the recorder's window inside the timed span, so the
        sampler's work for these calls (per role, worker and method) counts against them
        (the stats thread does it once a second, beside the calls)."""
        started = time.perf_counter()
        await asyncio.gather(
            *(sched.async_call_engine(ids[i % len(ids)], "noop") for i in range(fan_n))
        )
        if sample:
            on.sample()
        return fan_n / (time.perf_counter() - started)

    async def fan() -> dict[str, list[float]]:
        rates: dict[str, list[float]] = {"on": [], "off": []}
        await gather_once()  # opens the connections
        for rep in range(fan_reps):
            for mode in ("on", "off") if rep % 2 == 0 else ("off", "on"):
                previous = _with(sched, on if mode == "on" else off)
                try:
                    rates[mode].append(await gather_once(sample=mode == "on"))
                finally:
                    _with(sched, previous)
        return rates

    # the publisher's thread samples the recorder once a second (draining, sorting,
    # percentiles): that work competes for the controller's GIL, so it runs here too
    done = threading.Event()

    def publisher() -> None:
        while not done.wait(1.0):
            on.sample()

    sampler = threading.Thread(target=publisher, name="bench-stats-sampler", daemon=True)
    sampler.start()
    try:
        rates = asyncio.run(fan())
    finally:
        done.set()
        sampler.join()
    p50 = {m: percentile(v, 50) for m, v in lat.items()}
    before = "bare" if "bare" in p50 else "off"
    log(
        f"stats overhead: noop p50 {p50['on']:.4f} ms with stats, {p50['off']:.4f} ms with the "
        f"recorder off, {p50.get('bare', float('nan')):.4f} ms without the hook; "
        f"fan-out {median(rates['on']):.0f}/s with, {median(rates['off']):.0f}/s without"
    )
    note = "alternating blocks on the same worker: stats on (CallStats), recorder off "
    note += "(NullCallStats), and call_engine's body without the hook (bare)"
    return [
        Row(
            key=f"{NAME}.noop.stats_overhead",
            backend=NAME,
            label="noop call_engine p50 with the live view's call statistics",
            unit="ms",
            value=p50["on"],
            baseline=p50[before],
            baseline_label="the same calls without the hook (call_engine's body before issue 16)"
            if before == "bare"
            else "the same calls with the recorder off",
            targets=[Target("ratio", "<=", 1.1, "<= 1.1x before")],
            samples={"corral": rounded(lat["on"], 4), "baseline": rounded(lat[before], 4)},
            extra={
                "p50_ms": {m: round(v, 4) for m, v in p50.items()},
                "p99_ms": {m: round(percentile(v, 99), 4) for m, v in lat.items()},
                "note": note,
            },
        ),
        Row(
            key=f"{NAME}.fanout.stats_overhead",
            backend=NAME,
            label=f"async fan-out ({fan_n} calls) with the live view's call statistics",
            unit="calls/s",
            value=median(rates["on"]),
            baseline=median(rates["off"]),
            baseline_label="the same gathers with statistics off",
            higher_is_better=True,
            targets=[Target("ratio", "<=", 1.1, "<= 1.1x without stats")],
            samples={"corral": rounded(rates["on"], 1), "baseline": rounded(rates["off"], 1)},
            extra={"note": note},
        ),
    ]


def main() -> None:
    """``python benchmarks/stats_overhead.py [--quick]``: just these rows, 4 workers."""
    from common import run_alone_on_echo_workers

    run_alone_on_echo_workers(bench, "stats")


if __name__ == "__main__":
    main()
