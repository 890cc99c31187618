"""corral on Ray, next to the same figures on the local backend and a bare Ray actor.

Rows (keys ``ray.*``): cold start of 8 workers, noop call_engine p50/p99, a 128 MiB
float32 round trip, delete_workers of 8 and what is left after it. Baselines: the local
backend's figures from the same run (``NEEDS`` makes run.py measure local first) and a
bare Ray actor: ``ray.get(actor.ping.remote())`` latency, and 8 bare actors created and
pinged for the cold start.

The benchmark starts its own Ray runtime (``address="local"``, its own temp dir, so it
neither joins nor disturbs another runtime on this machine) with ``num_cpus=16,
num_gpus=8, include_dashboard=False, object_store_memory=256 MiB`` and
``RAY_USAGE_STATS_ENABLED=0``, and shuts it down at the end (also on error or Ctrl-C).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time

import numpy as np
from common import (
    BackendUnavailable,
    Context,
    Row,
    Target,
    hold_lock,
    log,
    median,
    percentile,
    processes_left,
    rounded,
)

NAME = "ray"
NEEDS = ["local"]  # the local rows are this backend's baselines
MiB = 1 << 20
ENGINE = "corral.testing.engines.EchoEngine"
RAY_INIT = {
    "num_cpus": 16,
    "num_gpus": 8,
    "include_dashboard": False,
    "object_store_memory": 256 * MiB,
}


def check() -> str | None:
    """Why the Ray rows cannot run here, or None."""
    try:
        import corral.backends.ray.scheduler  # noqa: F401
    except Exception as exc:
        return (
            "corral.backends.ray.scheduler cannot be imported "
            f"({type(exc).__name__}: {exc}); the Ray backend is not available yet"
        )
    try:
        import ray  # noqa: F401
    except Exception as exc:
        return f"ray cannot be imported ({type(exc).__name__}: {exc}); pip install 'corral[ray]'"
    return None


class Plan:
    def __init__(self, quick: bool):
        self.workers = 8
        self.cold_reps = 1 if quick else 3
        self.noop_warmup = 50 if quick else 200
        self.noop_calls = 300 if quick else 2000
        self.payload_mib = 128
        self.payload_reps = 2 if quick else 5
        self.bare_reps = 1 if quick else 2


def _start_runtime(ctx: Context):
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    from corral.backends.ray.runtime import apply_quiet_env

    apply_quiet_env()
    import ray

    if ray.is_initialized():
        raise BackendUnavailable("ray is already initialised in this process")
    temp = tempfile.mkdtemp(prefix="crb-ray-", dir="/tmp")  # short: Ray's socket paths
    ctx.on_close(shutil.rmtree, temp, True)
    started = time.perf_counter()
    ray.init(address="local", _temp_dir=temp, log_to_driver=False, **RAY_INIT)
    ctx.on_close(ray.shutdown)
    log(f"ray: runtime up in {time.perf_counter() - started:.1f}s ({ray.cluster_resources()})")
    return ray


def _bare_actor_class(ray):
    class Pinger:
        def ping(self) -> int:
            return 0

    return ray.remote(Pinger)


def bare_actor_ping(ray, warmup: int, n: int) -> list[float]:
    actor = _bare_actor_class(ray).options(num_cpus=0).remote()
    try:
        for _ in range(warmup):
            ray.get(actor.ping.remote())
        lat = []
        for _ in range(n):
            started = time.perf_counter()
            ray.get(actor.ping.remote())
            lat.append(time.perf_counter() - started)
        return lat
    finally:
        ray.kill(actor, no_restart=True)


def bare_actor_start(ray, n: int) -> float:
    """Seconds until ``n`` new bare actors (1 CPU each) answer a ping."""
    cls = _bare_actor_class(ray)
    started = time.perf_counter()
    actors = [cls.options(num_cpus=1).remote() for _ in range(n)]
    try:
        ray.get([a.ping.remote() for a in actors])
        return time.perf_counter() - started
    finally:
        for a in actors:
            ray.kill(a, no_restart=True)


def bare_actor_start_pg(ray, n: int) -> float:
    """Seconds until ``n`` new bare actors, each in its own 1-CPU placement group (created
    and waited for first, as corral's default ``separate`` strategy does) and with no
    runtime_env of its own, answer a ping. Groups and actors are removed afterwards."""
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    cls = _bare_actor_class(ray)
    started = time.perf_counter()
    groups = [placement_group([{"CPU": 1.0}], strategy="SPREAD") for _ in range(n)]
    actors = []
    try:
        ray.get([g.ready() for g in groups])
        actors = [
            cls.options(
                num_cpus=1,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=g, placement_group_bundle_index=0
                ),
            ).remote()
            for g in groups
        ]
        ray.get([a.ping.remote() for a in actors])
        return time.perf_counter() - started
    finally:
        for a in actors:
            ray.kill(a, no_restart=True)
        for g in groups:
            remove_placement_group(g)
        _wait_groups_removed(ray, groups)


def _wait_groups_removed(ray, groups, timeout: float = 30.0) -> None:
    from ray.util.placement_group import placement_group_table

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(placement_group_table(g).get("state") == "REMOVED" for g in groups):
            return
        time.sleep(0.05)


def _scheduler(ctx: Context):
    from corral.backends.ray.scheduler import RayScheduler
    from corral.config import BaseExperimentConfig

    cfg = BaseExperimentConfig(experiment_name=ctx.unique_name("benchray"), trial_name="t0")
    sched = RayScheduler(
        exp_config=cfg, fileroot=ctx.fileroot, startup_timeout=180.0, progress=lambda t: None
    )
    ctx.on_close(sched.close)
    return sched


def _job(role: str, replicas: int):
    from corral import Job, SchedulingSpec

    return Job(role=role, replicas=replicas, tasks=[SchedulingSpec(cpu=1, gpu=0)])


def _leftovers(ray, sched, pids: list[int]) -> dict:
    from ray.util.placement_group import placement_group_table

    from corral.backends.ray.state import name_prefix

    prefix = name_prefix(sched.experiment_name, sched.trial_name) + ":"
    groups = [
        v["name"]
        for v in placement_group_table().values()
        if (v.get("name") or "").startswith(prefix) and v.get("state") != "REMOVED"
    ]
    actors = [
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["name"].startswith(prefix)
    ]
    procs = processes_left(pids)
    return {
        **procs,
        "placement_groups": groups,
        "named_actors": actors,
        "left": procs["left"] + len(groups) + len(actors),
    }


def _timed_delete(ray, sched, role: str) -> tuple[float, dict]:
    pids = [w.pid for w in sched.get_workers(role) if w.pid]
    started = time.perf_counter()
    sched.delete_workers(role)
    elapsed = time.perf_counter() - started
    return elapsed, _leftovers(ray, sched, pids)


def _local(ctx: Context, key: str) -> tuple[float | None, str]:
    row = ctx.row(key)
    if row is None:
        return None, "local backend (not measured in this run)"
    return row.value, "local backend, same run"


def run(ctx: Context) -> list[Row]:
    reason = check()
    if reason:
        raise BackendUnavailable(reason)
    plan = Plan(ctx.quick)
    hold_lock(ctx, "/tmp/corral-ray.lock", "ray")
    ray = _start_runtime(ctx)
    sched = _scheduler(ctx)

    async def engines(ids: list[str]) -> None:
        await asyncio.gather(*(sched.create_engine(i, ENGINE) for i in ids))

    bare_start = [bare_actor_start(ray, plan.workers) for _ in range(plan.bare_reps)]
    bare_pg: list[float] = []
    cold: list[float] = []
    deletes: list[float] = []
    lefts: list[dict] = []
    ids: list[str] = []
    role = ""
    for rep in range(plan.cold_reps):
        role = f"ray{plan.workers}-r{rep}"
        bare_pg.append(bare_actor_start_pg(ray, plan.workers))  # interleaved with corral's
        started = time.perf_counter()
        ids = sched.create_workers(_job(role, plan.workers))
        cold.append(time.perf_counter() - started)
        asyncio.run(engines(ids))
        log(
            f"ray: cold start of {plan.workers} rep {rep}: {cold[-1]:.2f}s (bare actors in "
            f"placement groups {bare_pg[-1]:.2f}s)"
        )
        if rep < plan.cold_reps - 1:
            seconds, left = _timed_delete(ray, sched, role)
            deletes.append(seconds)
            lefts.append(left)

    # noop on the last role's first worker, next to a bare actor ping
    bare_lat = bare_actor_ping(ray, plan.noop_warmup, plan.noop_calls // 2)
    for _ in range(plan.noop_warmup):
        sched.call_engine(ids[0], "noop")
    lat = []
    for _ in range(plan.noop_calls):
        started = time.perf_counter()
        sched.call_engine(ids[0], "noop")
        lat.append(time.perf_counter() - started)
    bare_lat += bare_actor_ping(ray, 20, plan.noop_calls // 2)
    ms, bare_ms = [x * 1e3 for x in lat], [x * 1e3 for x in bare_lat]
    log(
        f"ray: noop p50 {percentile(ms, 50):.3f} ms; bare actor ping p50 "
        f"{percentile(bare_ms, 50):.3f} ms"
    )

    nbytes = plan.payload_mib * MiB
    array = np.arange(nbytes // 4, dtype=np.float32)
    back = sched.call_engine(ids[1], "echo", None, array)
    verified = bool(np.array_equal(array, back))
    del back
    payload_s = []
    for _ in range(plan.payload_reps):
        started = time.perf_counter()
        sched.call_engine(ids[1], "echo", None, array)
        payload_s.append(time.perf_counter() - started)
    del array
    rate = [2 * nbytes / s / 1e9 for s in payload_s]
    log(f"ray: {plan.payload_mib} MiB round trip {median(rate):.2f} GB/s")

    seconds, left = _timed_delete(ray, sched, role)
    deletes.append(seconds)
    lefts.append(left)
    log(f"ray: delete of {plan.workers}: {deletes}; left {[x['left'] for x in lefts]}")

    n = plan.workers
    local_cold, local_cold_label = _local(ctx, f"local.cold_start.n{n}")
    local_p50, local_label = _local(ctx, "local.noop.p50")
    local_payload, local_payload_label = _local(ctx, f"local.payload.f32_{plan.payload_mib}MiB")
    local_delete, local_delete_label = _local(ctx, f"local.delete.n{n}")
    return [
        Row(
            key=f"ray.cold_start.n{n}.vs_bare",
            backend=NAME,
            label=f"Ray: cold start, {n} workers ready vs bare actors",
            unit="s",
            value=median(cold),
            baseline=median(bare_pg),
            baseline_label=f"{n} bare Ray actors, each in its own 1-CPU placement group, no "
            "runtime_env, created and pinged",
            targets=[Target("ratio", "<=", 1.5, "<= 1.5x bare actors")],
            samples={"corral": rounded(cold), "baseline": rounded(bare_pg)},
        ),
        Row(
            key=f"ray.cold_start.n{n}",
            backend=NAME,
            label=f"Ray: cold start, {n} workers ready",
            unit="s",
            value=median(cold),
            baseline=local_cold,
            baseline_label=local_cold_label,
            samples={"corral": rounded(cold)},
            extra={
                "bare_actors_start_s": rounded(bare_start),
                "bare_actors_note": f"{n} bare Ray actors (1 CPU each) created and pinged",
            },
        ),
        Row(
            key="ray.noop.p50",
            backend=NAME,
            label="Ray: noop call_engine p50",
            unit="ms",
            value=percentile(ms, 50),
            baseline=percentile(bare_ms, 50),
            baseline_label="bare Ray actor ping p50, ray.get(actor.ping.remote())",
            samples={"corral": rounded(ms, 4), "baseline": rounded(bare_ms, 4)},
        ),
        Row(
            key="ray.noop.p99",
            backend=NAME,
            label="Ray: noop call_engine p99",
            unit="ms",
            value=percentile(ms, 99),
            baseline=percentile(bare_ms, 99),
            baseline_label="bare Ray actor ping p99",
        ),
        Row(
            key="ray.noop.p50.vs_local",
            backend=NAME,
            label="Ray: noop call_engine p50 vs local",
            unit="ms",
            value=percentile(ms, 50),
            baseline=local_p50,
            baseline_label=local_label,
            targets=[Target("ratio", "<=", 1.5, "<= 1.5x local")],
        ),
        Row(
            key=f"ray.payload.f32_{plan.payload_mib}MiB",
            backend=NAME,
            label=f"Ray: round trip {plan.payload_mib} MiB float32 numpy",
            unit="GB/s",
            value=median(rate),
            baseline=local_payload,
            baseline_label=local_payload_label,
            higher_is_better=True,
            samples={"corral_s": rounded(payload_s)},
            extra={"nbytes": nbytes, "verified_equal": verified},
        ),
        Row(
            key=f"ray.delete.n{n}",
            backend=NAME,
            label=f"Ray: delete_workers, {n} workers with an engine each",
            unit="s",
            value=median(deletes),
            baseline=local_delete,
            baseline_label=local_delete_label,
            samples={"corral": rounded(deletes)},
        ),
        Row(
            key=f"ray.delete.n{n}.left",
            backend=NAME,
            label=f"Ray: processes, actors and placement groups left after delete of {n}",
            unit="processes",
            value=float(max(x["left"] for x in lefts)),
            baseline=0.0,
            baseline_label="none expected",
            targets=[Target("abs", "==", 0.0, "0 left")],
            extra={"detail": lefts},
        ),
    ]
