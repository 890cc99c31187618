"""Broadcast across stand-in hosts whose links are the bottleneck (issue 12), root only.

    python benchmarks/run.py --backends netns          # or: python benchmarks/bench_netns.py

One machine plays 1 + N hosts (``netns.py``): each worker runs in its own network namespace
*and* UTS namespace (own host name, so corral treats them as different hosts: TCP, no
shared memory), and every host's link to the bridge is limited to ``CORRAL_BENCH_NETNS_RATE``
(default 1gbit) in both directions. The workers are corral's own (``python -m
corral.worker`` started by the local launcher with the namespace command as
``SchedulingSpec.cmd``), talking the real protocol over real sockets between namespaces.
Same run, alternating, 256 MiB fresh ref from the owner on host 0:

* one: one reader fetches it whole (``CORRAL_RELAY=0``): one transfer over one link;
* relay: N readers (hosts 1..N) fetch it at once; the owner hands out a chain;
* owner-fetch: N readers on the same hosts with ``CORRAL_RELAY=0`` fetch it at once, each
  from the owner (the owner's link carries N copies).

Rows (keys ``netns.*``):

* ``netns.broadcast.256MiB_xN.vs_one``          relay broadcast vs one transfer; target <= 2x
* ``netns.broadcast.256MiB_xN.vs_owner_fetch``  relay broadcast vs owner-fetch (info; the
  owner's link makes owner-fetch ~N transfers)
* ``netns.broadcast.256MiB_xN.owner_bytes``     bytes the owner sent, relay vs owner-fetch;
  target <= 1.5/N
* ``netns.transfer.256MiB``                     one transfer vs the link's line rate (info:
  shows the link, not the CPU, bounds a transfer)
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

NAME = "netns"
MiB = 1 << 20
ENGINE = "corral.testing.data_engines.DataEngine"
RATE = os.environ.get("CORRAL_BENCH_NETNS_RATE", "1gbit")


def check() -> str | None:
    return netns.unavailable()


def rate_bits(rate: str) -> float:
    """``tc`` rate text (``1gbit``, ``500mbit``, ``100kbit``) in bit/s."""
    units = {"gbit": 1e9, "mbit": 1e6, "kbit": 1e3, "bit": 1.0}
    for unit, factor in units.items():
        if rate.lower().endswith(unit):
            return float(rate[: -len(unit)]) * factor
    raise ValueError(f"CORRAL_BENCH_NETNS_RATE={rate!r}: use e.g. 1gbit, 500mbit")


def _scheduler(ctx: Context):
    from corral.backends.local import LocalScheduler
    from corral.config import BaseExperimentConfig

    cfg = BaseExperimentConfig(experiment_name=ctx.unique_name("netns"), trial_name="t0")
    sched = LocalScheduler(
        exp_config=cfg,
        gpu_devices=[],
        fileroot=ctx.fileroot,
        startup_timeout=180.0,
        progress=lambda t: None,
    )
    ctx.on_close(sched.close)
    return sched


def _workers(sched, topo: netns.Topology, role: str, hosts: list[int], env: dict) -> list[str]:
    """One corral worker on each of ``hosts``, started inside that host's namespaces."""
    from corral import Job, SchedulingSpec

    tasks = [
        SchedulingSpec(
            cpu=1,
            cmd=shlex.join([*topo.prefix(h), sys.executable, "-m", "corral.worker"]),
            env_vars={**env, "CORRAL_ADVERTISE_HOST": topo.address(h)},
        )
        for h in hosts
    ]
    ids = sched.create_workers(Job(role=role, replicas=len(hosts), tasks=tasks))
    for wid in ids:
        asyncio.run(sched.create_engine(wid, ENGINE))
    return ids


def _stats(sched, wid: str) -> dict:
    return sched.parts.caller.call(sched.parts.table.worker(wid), "/data/stats", {})


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds the processes ``pids`` have used so far."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / tick


def _once(sched, owner: str, who: list[str], nbytes: int, pids: list[int]) -> tuple:
    """(seconds, bytes the owner sent, CPU seconds of all workers) for a fresh ref read by
    every worker of ``who``."""
    ref = sched.call_engine(owner, "array", None, nbytes, rpc_meta={"keep": True})
    before = _stats(sched, owner)["served_bytes"]
    cpu_before = cpu_seconds(pids)

    async def read_all() -> list:
        return await asyncio.gather(
            *(sched.async_call_engine(w, "describe", None, ref) for w in who)
        )

    started = time.perf_counter()
    got = asyncio.run(read_all())
    took = time.perf_counter() - started
    cpu = cpu_seconds(pids) - cpu_before
    assert all(g == got[0] and g["nbytes"] == nbytes for g in got), got
    sent = _stats(sched, owner)["served_bytes"] - before
    ref.free()
    return took, sent, cpu


def measure(sched, topo: netns.Topology, n: int, reps: int, nbytes: int) -> dict:
    (owner,) = _workers(sched, topo, "owner", [0], {})
    hosts = list(range(1, n + 1))
    relay = _workers(sched, topo, "relay", hosts, {})
    plain = _workers(sched, topo, "plain", hosts, {"CORRAL_RELAY": "0"})
    hostnames = {
        w.id: f"{w.host} {w.ip}" for role in ("owner", "relay") for w in sched.get_workers(role)
    }
    pids = [w.pid for role in ("owner", "relay", "plain") for w in sched.get_workers(role)]
    times: dict[str, list[float]] = {"relay": [], "owner_fetch": [], "one": []}
    sent: dict[str, list[float]] = {"relay": [], "owner_fetch": [], "one": []}
    cpu: dict[str, list[float]] = {"relay": [], "owner_fetch": [], "one": []}
    who = {"relay": relay, "owner_fetch": plain, "one": plain[:1]}
    for i in range(reps + 1):
        order = ("relay", "owner_fetch", "one") if i % 2 else ("one", "owner_fetch", "relay")
        for name in order:
            took, nsent, used = _once(sched, owner, who[name], nbytes, pids)
            log(
                f"netns {name:11s} rep {i}: {took:.2f} s, owner sent {nsent / nbytes:.2f} "
                f"copies, workers used {used:.1f} CPU s, load {os.getloadavg()[0]:.1f}"
            )
            if i == 0:
                continue  # warm-up: connections, pages, relay memory
            times[name].append(took)
            sent[name].append(float(nsent))
            cpu[name].append(used)
    return {"times": times, "sent": sent, "cpu": cpu, "hosts": hostnames}


def rows(result: dict, n: int, nbytes: int, rate: str) -> list[Row]:
    times, sent = result["times"], result["sent"]
    key = f"netns.broadcast.{nbytes // MiB}MiB_x{n}"
    extra = {
        "nbytes": nbytes,
        "readers": n,
        "link_rate": rate,
        "how": "1+N network + UTS namespaces, veth into one bridge, tc tbf on both ends",
    }
    line_s = nbytes * 8 / rate_bits(rate)
    relay_s, plain_s, one_s = (median(times[k]) for k in ("relay", "owner_fetch", "one"))
    log(
        f"netns 256 MiB x{n} at {rate}: one {one_s:.2f} s (line rate {line_s:.2f} s), relay "
        f"{relay_s:.2f} s ({relay_s / one_s:.2f}x one), owner-fetch {plain_s:.2f} s "
        f"({plain_s / relay_s:.2f}x relay); worker CPU s per broadcast: "
        + ", ".join(f"{k} {median(v):.1f}" for k, v in result["cpu"].items())
    )
    samples = {
        "relay_s": rounded(times["relay"]),
        "owner_fetch_s": rounded(times["owner_fetch"]),
        "one_s": rounded(times["one"]),
        # CPU seconds all workers used: every stand-in host shares this machine's CPUs
        **{f"{k}_cpu_s": rounded(v, 2) for k, v in result["cpu"].items()},
    }
    return [
        Row(
            key=f"{key}.vs_one",
            backend=NAME,
            label=f"256 MiB ref to {n} hosts through the relay vs to 1 host ({rate} links)",
            unit="s",
            value=relay_s,
            baseline=one_s,
            baseline_label="one transfer of the same ref to one host",
            targets=[Target("ratio", "<=", 2.0, "<= 2x one transfer")],
            samples=samples,
            extra=extra,
        ),
        Row(
            key=f"{key}.vs_owner_fetch",
            backend=NAME,
            label=f"256 MiB ref to {n} hosts: relay chain vs every host fetching from the owner",
            unit="s",
            value=relay_s,
            baseline=plain_s,
            baseline_label=f"owner-fetch (CORRAL_RELAY=0): the owner's {rate} link carries N copies",
            samples=samples,
            extra=extra,
        ),
        Row(
            key=f"{key}.owner_bytes",
            backend=NAME,
            label=f"256 MiB ref to {n} hosts: bytes the owner sent, relay vs owner-fetch",
            unit="B",
            value=median(sent["relay"]),
            baseline=median(sent["owner_fetch"]),
            baseline_label="owner-fetch",
            targets=[Target("ratio", "<=", 1.5 / n, f"<= 1.5/{n} (about one copy)")],
            samples={"relay_B": sent["relay"], "owner_fetch_B": sent["owner_fetch"]},
            extra=extra,
        ),
        Row(
            key=f"netns.transfer.{nbytes // MiB}MiB",
            backend=NAME,
            label=f"one 256 MiB ref to one host vs the link's line rate ({rate})",
            unit="s",
            value=one_s,
            baseline=line_s,
            baseline_label=f"256 MiB at {rate}",
            samples={"one_s": rounded(times["one"])},
            extra={**extra, "worker_hosts": result["hosts"]},
        ),
    ]


def run(ctx: Context) -> list[Row]:
    why = check()
    if why:
        raise BackendUnavailable(why)
    rate_bits(RATE)  # bad setting: say so before anything is built
    n = 2 if ctx.quick else 8
    reps = 1 if ctx.quick else 3
    nbytes = 256 * MiB
    removed = netns.sweep_stale()
    if removed:
        log(f"netns: removed what SIGKILLed runs left: {' '.join(removed)}")
    topo = netns.Topology(hosts=1 + n, rate=RATE)
    ctx.on_close(topo.teardown)  # after the workers (cleanups run in reverse)
    topo.setup()
    log(f"netns: {1 + n} hosts in {topo.subnet}, links {RATE} each way ({topo.tag}*)")
    sched = _scheduler(ctx)
    result = measure(sched, topo, n, reps, nbytes)
    sched.close()
    return rows(result, n, nbytes, RATE)


def main() -> int:
    """Standalone: this backend only, table on stdout (SIGTERM/SIGHUP clean up like ^C)."""
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
        log(f"netns: skipped: {exc}")
        return 0
    finally:
        ctx.close()
    print(report.markdown(doc, got))
    return 0


if __name__ == "__main__":
    sys.exit(main())
