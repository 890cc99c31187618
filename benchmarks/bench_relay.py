"""Cross-host broadcast through the relay (issue 12), part of the ``data`` benchmarks.

One machine stands in for several hosts: owner and readers run with ``CORRAL_SHM=0``, so
every transfer takes the TCP path a remote reader takes. Same run, alternating:

* relay: N readers fetch one fresh 256 MiB ref at once (the owner hands out a chain);
* naive: N other readers (``CORRAL_RELAY=0``) fetch it at once, each from the owner;
* one: a single reader fetches it.

Rows:

* ``data.relay.256MiB_xN.owner_bytes`` bytes the owner sent, relay vs naive (its own
  counter, ``served_bytes``); target <= 1.5/N (about one copy instead of N)
* ``data.relay.256MiB_xN``            wall time, relay vs naive, for information: all
  "links" here are loopback on one machine's CPUs, so the owner's link is no bottleneck
  and the relay's extra hops cost CPU the naive fetch does not spend
* ``data.relay.256MiB_xN.vs_one``      wall time, relay vs one reader, for information
"""

from __future__ import annotations

import asyncio
import time

from common import Row, Target, log, median, rounded

MiB = 1 << 20
ENGINE = "corral.testing.data_engines.DataEngine"
NO_SHM = {"CORRAL_SHM": "0"}


def _workers(sched, role: str, n: int, env: dict) -> list[str]:
    from corral import Job, SchedulingSpec

    ids = sched.create_workers(
        Job(role=role, replicas=n, tasks=[SchedulingSpec(cpu=1, env_vars=env)])
    )
    for wid in ids:
        asyncio.run(sched.create_engine(wid, ENGINE))
    return ids


def _served(sched, wid: str) -> int:
    return sched.parts.caller.call(sched.parts.table.worker(wid), "/data/stats", {})["served_bytes"]


def _once(sched, owner: str, who: list[str], nbytes: int) -> tuple[float, int]:
    """(seconds, bytes the owner sent) for a fresh ref read by every worker of ``who``."""
    ref = sched.call_engine(owner, "array", None, nbytes, rpc_meta={"keep": True})
    before = _served(sched, owner)

    async def read_all() -> list:
        return await asyncio.gather(
            *(sched.async_call_engine(w, "describe", None, ref) for w in who)
        )

    started = time.perf_counter()
    got = asyncio.run(read_all())
    took = time.perf_counter() - started
    assert all(g == got[0] and g["nbytes"] == nbytes for g in got)
    sent = _served(sched, owner) - before
    ref.free()
    return took, sent


def bench_relay(sched, n: int, reps: int) -> list[Row]:
    nbytes = 256 * MiB
    (owner,) = _workers(sched, "relay-owner", 1, NO_SHM)
    relay = _workers(sched, "relay-readers", n, NO_SHM)
    naive = _workers(sched, "naive-readers", n, {**NO_SHM, "CORRAL_RELAY": "0"})
    times: dict[str, list[float]] = {"relay": [], "naive": [], "one": []}
    sent: dict[str, list[float]] = {"relay": [], "naive": []}
    for i in range(reps + 1):
        order = ("relay", "naive", "one") if i % 2 else ("one", "naive", "relay")
        for name in order:
            who = {"relay": relay, "naive": naive, "one": relay[:1]}[name]
            took, nsent = _once(sched, owner, who, nbytes)
            if i == 0:
                continue  # warm-up
            times[name].append(took)
            if name in sent:
                sent[name].append(float(nsent))
    log(
        f"relay 256 MiB x{n}: relay {median(times['relay']) * 1e3:.0f} ms "
        f"(owner sent {median(sent['relay']) / nbytes:.2f} copies), naive "
        f"{median(times['naive']) * 1e3:.0f} ms ({median(sent['naive']) / nbytes:.2f} copies), "
        f"one reader {median(times['one']) * 1e3:.0f} ms"
    )
    key = f"data.relay.256MiB_x{n}"
    extra = {"nbytes": nbytes, "readers": n, "stand_in": "CORRAL_SHM=0 on one machine"}
    return [
        Row(
            key=f"{key}.owner_bytes",
            backend="data",
            label=f"one 256 MiB ref to {n} readers on other hosts (stand-in): bytes the owner sent",
            unit="B",
            value=median(sent["relay"]),
            baseline=median(sent["naive"]),
            baseline_label="every reader fetches from the owner",
            targets=[Target("ratio", "<=", 1.5 / n, f"<= 1.5/{n} (about one copy)")],
            samples={"corral_B": sent["relay"], "baseline_B": sent["naive"]},
            extra=extra,
        ),
        Row(
            key=key,
            backend="data",
            label=f"one 256 MiB ref to {n} readers on other hosts (stand-in): relay chain",
            unit="s",
            value=median(times["relay"]),
            baseline=median(times["naive"]),
            baseline_label="every reader fetches from the owner (one machine: no link limit)",
            samples={"corral_s": rounded(times["relay"]), "baseline_s": rounded(times["naive"])},
            extra=extra,
        ),
        Row(
            key=f"{key}.vs_one",
            backend="data",
            label=f"one 256 MiB ref to {n} readers through the relay vs to one reader",
            unit="s",
            value=median(times["relay"]),
            baseline=median(times["one"]),
            baseline_label="the same ref to one reader",
            samples={"corral_s": rounded(times["relay"]), "baseline_s": rounded(times["one"])},
            extra=extra,
        ),
    ]
