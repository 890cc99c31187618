"""Two commits of corral in the same run: noop p50, async fan-out and the live view's cost.

A cost line such as "within 1.1x of before the security work, measured in the same run"
(issue 25) or a before/after of a speed pass (issue 29) needs both versions measured in
the same minutes. This script checks each commit out into its own folder
(``git archive``: no working tree is touched), then starts one measuring process per
commit and mode in turn, alternating A, B, B, A, ... so both see the same background
load. Each process imports corral from its commit's ``src`` (``PYTHONPATH``) and uses the
public API only (``create_workers``, ``create_engine``, ``call_engine``,
``async_call_engine``), so any two commits compare:

* noop p50: ``call_engine(wid, "noop")`` on one of 8 echo workers;
* fan-out: calls/s of one ``asyncio.gather`` of 4,000 ``async_call_engine`` noops over
  the 8 workers (median of 3 gathers);
* the CPU time per fan-out call of the controller and of the 8 workers (``/proc``): a
  loaded machine moves it much less than the wall time;
* all with the live view on (the default: call statistics, the stats file, usage reads)
  and off (``CORRAL_STATS=0`` for controller and workers); the view's overhead of a
  commit is off / on of its own processes.

    python benchmarks/ab_commits.py BEFORE AFTER [--rounds 3] [--repo .]

Prints one line per figure: the medians for A and B and B's ratio to A (time / time,
or for rates A / B: above 1.0, B is slower). A diagnostic, not a row of the results
table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WORKERS = 8
NOOP_CALLS = 1000
FAN_CALLS = 4000
FAN_GATHERS = 3


def measure() -> dict:
    """In a measuring process: the figures of the corral found on ``PYTHONPATH``."""
    from corral import Job, SchedulingSpec
    from corral.backends.local import LocalScheduler
    from corral.config import BaseExperimentConfig

    fileroot = tempfile.mkdtemp(prefix="corral-ab-")
    cfg = BaseExperimentConfig(experiment_name=f"ab-{os.getpid()}", trial_name="t0")
    sched = LocalScheduler(
        exp_config=cfg, gpu_devices=[], fileroot=fileroot, startup_timeout=120.0,
        progress=lambda text: None,
    )  # fmt: skip
    try:
        job = Job(role="ab", replicas=WORKERS, tasks=[SchedulingSpec(cpu=1, gpu=0)])
        ids = sched.create_workers(job)

        async def engines() -> None:
            echo = "corral.testing.engines.EchoEngine"
            await asyncio.gather(*(sched.create_engine(w, echo) for w in ids))

        asyncio.run(engines())
        for _ in range(200):
            sched.call_engine(ids[0], "noop")
        lat = []
        for _ in range(NOOP_CALLS):
            started = time.perf_counter()
            sched.call_engine(ids[0], "noop")
            lat.append(time.perf_counter() - started)

        pids = [w.pid for w in sched.get_workers("ab") if w.pid]
        cpu: list[tuple[float, float]] = []  # (controller, workers) CPU seconds per call

        async def fan() -> list[float]:
            async def once() -> float:
                c0, w0, started = time.process_time(), _cpu_of(pids), time.perf_counter()
                await asyncio.gather(
                    *(sched.async_call_engine(ids[i % WORKERS], "noop") for i in range(FAN_CALLS))
                )
                took = time.perf_counter() - started
                cpu.append(
                    ((time.process_time() - c0) / FAN_CALLS, (_cpu_of(pids) - w0) / FAN_CALLS)
                )
                return FAN_CALLS / took

            await once()  # opens the connections
            cpu.clear()
            return [await once() for _ in range(FAN_GATHERS)]

        rates = asyncio.run(fan())
        return {
            "noop_p50_ms": statistics.median(lat) * 1e3,
            "fanout_per_s": statistics.median(rates),
            # CPU time per call: a loaded machine moves it much less than the wall time
            "fanout_controller_cpu_us": statistics.median(c for c, _ in cpu) * 1e6,
            "fanout_workers_cpu_us": statistics.median(w for _, w in cpu) * 1e6,
        }
    finally:
        sched.delete_workers()
        sched.close()
        shutil.rmtree(fileroot, ignore_errors=True)


def _cpu_of(pids: list[int]) -> float:
    """CPU seconds (user + system) the processes ``pids`` used so far (/proc, in ticks)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def checkout(repo: str, commit: str, into: str) -> str:
    """``commit``'s ``src`` in a folder of its own; the folder to put on PYTHONPATH."""
    archive = subprocess.run(
        ["git", "-C", repo, "archive", commit, "src"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    return os.path.join(into, "src")


def run_one(src: str, view: bool) -> dict:
    env = {**os.environ, "PYTHONPATH": src}
    if not view:
        env["CORRAL_STATS"] = "0"
    else:
        env.pop("CORRAL_STATS", None)
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--measure"],
        env=env, capture_output=True, text=True, timeout=600, cwd=HERE,
    )  # fmt: skip
    if out.returncode != 0:
        raise SystemExit(f"the measuring process failed ({src}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", nargs="?")
    parser.add_argument("after", nargs="?")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repo", default=os.path.dirname(HERE))
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure()))
        return
    if not args.before or not args.after:
        parser.error("name two commits: BEFORE AFTER")
    root = tempfile.mkdtemp(prefix="corral-ab-commits-")
    try:
        trees = {}
        for label, commit in (("A", args.before), ("B", args.after)):
            os.makedirs(os.path.join(root, label))
            trees[label] = checkout(args.repo, commit, os.path.join(root, label))
        results: dict[tuple[str, bool], list[dict]] = {}
        for r in range(args.rounds):
            order = ("A", "B") if r % 2 == 0 else ("B", "A")
            for view in (True, False):
                for label in order:
                    got = run_one(trees[label], view)
                    results.setdefault((label, view), []).append(got)
                    print(
                        f"round {r + 1} {label} view={'on' if view else 'off'}: {got}", flush=True
                    )
    finally:
        shutil.rmtree(root, ignore_errors=True)

    def med(label: str, view: bool, key: str) -> float:
        return statistics.median(x[key] for x in results[(label, view)])

    print(f"\nA = {args.before}, B = {args.after}, {args.rounds} round(s), medians:")
    for view in (True, False):
        a, b = med("A", view, "noop_p50_ms"), med("B", view, "noop_p50_ms")
        print(
            f"noop p50 (view {'on' if view else 'off'}): A {a:.4f} ms, B {b:.4f} ms, B/A {b / a:.2f}x"
        )
        a, b = med("A", view, "fanout_per_s"), med("B", view, "fanout_per_s")
        print(
            f"fan-out (view {'on' if view else 'off'}): A {a:,.0f}/s, B {b:,.0f}/s, A/B {a / b:.2f}x"
        )
        for side in ("controller", "workers"):
            key = f"fanout_{side}_cpu_us"
            a, b = med("A", view, key), med("B", view, key)
            print(
                f"fan-out {side} CPU per call (view {'on' if view else 'off'}): "
                f"A {a:.1f} us, B {b:.1f} us, B/A {b / a:.2f}x"
            )
    for label in ("A", "B"):
        on, off = med(label, True, "fanout_per_s"), med(label, False, "fanout_per_s")
        p_on, p_off = med(label, True, "noop_p50_ms"), med(label, False, "noop_p50_ms")
        print(
            f"{label}: the live view's overhead: fan-out {off / on:.2f}x, noop p50 {p_on / p_off:.2f}x"
        )


if __name__ == "__main__":
    main()
