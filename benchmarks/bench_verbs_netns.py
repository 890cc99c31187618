"""Weight sync across stand-in hosts whose links are the bottleneck (issue 23), root only.

    python benchmarks/run.py --backends verbs_netns   # or: python benchmarks/bench_verbs_netns.py

The trainer on host 0 and N rollout workers on hosts 1..N, each in its own network and UTS
namespace with its link limited to ``CORRAL_BENCH_NETNS_RATE`` (default 1gbit) both ways
(``netns.py``, as ``bench_netns.py``). A ``CORRAL_BENCH_VERBS_NETNS_MB`` MB (default 256)
fp32 state dict goes to every rollout worker, alternating:

* group: a gloo group across the two roles, ``broadcast_state_dict`` from the trainer;
* relay: a ref of the flat weights read by every rollout worker at once (the chain).

Rows (keys ``verbs.netns.*``), each against the link's line rate (nbytes at the rate):

* ``verbs.netns.weights.<S>MB_x<N>.relay``  target <= 1.3x the line rate
* ``verbs.netns.weights.<S>MB_x<N>.group``
* ``verbs.netns.weights.<S>MB_x<N>.best``   the faster of the two; target <= 1.3x
"""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import netns  # noqa: E402
from bench_netns import rate_bits  # noqa: E402
from common import (  # noqa: E402
    BackendUnavailable,
    Context,
    Row,
    Target,
    log,
    machine_info,
    median,
    rounded,
)

NAME = "verbs_netns"
RATE = os.environ.get("CORRAL_BENCH_NETNS_RATE", "1gbit")
WEIGHTS = "corral.testing.verb_engines.WeightEngine"


def check() -> str | None:
    return netns.unavailable()


def _scheduler(ctx: Context):
    from corral.backends.local import LocalScheduler
    from corral.config import BaseExperimentConfig

    cfg = BaseExperimentConfig(experiment_name=ctx.unique_name("vnetns"), trial_name="t0")
    sched = LocalScheduler(
        exp_config=cfg, gpu_devices=[], fileroot=ctx.fileroot, startup_timeout=180.0,
        progress=lambda t: None,
    )  # fmt: skip
    ctx.on_close(sched.close)
    return sched


def _workers(sched, topo: netns.Topology, role: str, hosts: list[int]) -> list[str]:
    from corral import Job, SchedulingSpec

    tasks = [
        SchedulingSpec(
            cpu=1,
            cmd=shlex.join([*topo.prefix(h), sys.executable, "-m", "corral.worker"]),
            env_vars={"CORRAL_ADVERTISE_HOST": topo.address(h)},
        )
        for h in hosts
    ]
    ids = sched.create_workers(Job(role=role, replicas=len(hosts), tasks=tasks))
    for wid in ids:
        asyncio.run(sched.create_engine(wid, WEIGHTS, None, wid))
    return ids


def _gather(sched, calls: list) -> list:
    async def run():
        return await asyncio.gather(*(sched.async_call_engine(w, m, None, *a) for w, m, a in calls))

    return asyncio.run(run())


def measure(sched, topo: netns.Topology, n: int, mbytes: int, reps: int) -> dict:
    (trainer,) = _workers(sched, topo, "trainer", [0])
    readers = _workers(sched, topo, "rollout", list(range(1, n + 1)))
    sched.call_engine(trainer, "make", None, mbytes, 0, 16)
    nbytes = sched.call_engine(trainer, "state_nbytes")
    sched.create_process_group("weights", [trainer, *readers], timeout=600)

    def group() -> None:
        calls = [(trainer, "send", ("weights",))] + [(w, "receive", ("weights",)) for w in readers]
        assert _gather(sched, calls) == [nbytes] * (n + 1)

    def relay() -> None:
        ref = sched.call_engine(trainer, "state_array", None, rpc_meta={"keep": True})
        assert _gather(sched, [(w, "touch", (ref,)) for w in readers]) == [nbytes] * n
        ref.free()

    times: dict[str, list[float]] = {"group": [], "relay": []}
    for i in range(reps + 1):
        for name, fn in (("group", group), ("relay", relay))[:: 1 if i % 2 else -1]:
            started = time.perf_counter()
            fn()
            took = time.perf_counter() - started
            log(f"verbs netns {name} x{n} rep {i}: {took:.2f} s")
            if i:
                times[name].append(took)
    sched.destroy_process_group("weights")
    return {"times": times, "nbytes": nbytes}


def rows(result: dict, n: int, mbytes: int) -> list[Row]:
    times, nbytes = result["times"], result["nbytes"]
    line_s = nbytes * 8 / rate_bits(RATE)
    key = f"verbs.netns.weights.{mbytes}MB_x{n}"
    samples = {f"{k}_s": rounded(v) for k, v in times.items()}
    extra = {"nbytes": nbytes, "readers": n, "link_rate": RATE}
    best = min(times, key=lambda k: median(times[k]))
    out = [
        Row(
            key=f"{key}.{way}", backend=NAME,
            label=f"{mbytes} MB state dict to {n} hosts ({RATE} links): {way}",
            unit="s", value=median(times[way]), baseline=line_s,
            baseline_label=f"{mbytes} MB at {RATE} (one transfer at the line rate)",
            targets=[Target("ratio", "<=", 1.3, "<= 1.3x the line rate")] if way == "relay" else [],
            samples=samples, extra=extra,
        )
        for way in ("group", "relay")
    ]  # fmt: skip
    out.append(
        Row(
            key=f"{key}.best",
            backend=NAME,
            label=f"{mbytes} MB state dict to {n} hosts: the best way ({best}) vs the line rate",
            unit="s",
            value=median(times[best]),
            baseline=line_s,
            baseline_label=f"{mbytes} MB at {RATE}",
            targets=[Target("ratio", "<=", 1.3, "<= 1.3x the line rate")],
            samples=samples,
            extra={**extra, "best": best},
        )  # fmt: skip
    )
    return out


def run(ctx: Context) -> list[Row]:
    why = check()
    if why:
        raise BackendUnavailable(why)
    rate_bits(RATE)
    n = 2 if ctx.quick else 4
    reps = 1 if ctx.quick else 2
    mbytes = 64 if ctx.quick else int(os.environ.get("CORRAL_BENCH_VERBS_NETNS_MB", "256"))
    removed = netns.sweep_stale()
    if removed:
        log(f"netns: removed what SIGKILLed runs left: {' '.join(removed)}")
    topo = netns.Topology(hosts=1 + n, rate=RATE)
    ctx.on_close(topo.teardown)
    topo.setup()
    sched = _scheduler(ctx)
    result = measure(sched, topo, n, mbytes, reps)
    sched.close()
    return rows(result, n, mbytes)


def main() -> int:
    import report

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGHUP, interrupt)
    quick = "--quick" in sys.argv
    ctx = Context(quick=quick, repo=os.path.dirname(HERE))
    doc = {"machine": machine_info(ctx.repo), "options": {"quick": quick}}
    doc.update(skipped={}, failed={})
    try:
        got = [r.finish() for r in run(ctx)]
    except BackendUnavailable as exc:
        log(f"verbs_netns: skipped: {exc}")
        return 0
    finally:
        ctx.close()
    print(report.markdown(doc, got))
    return 0


if __name__ == "__main__":
    sys.exit(main())
