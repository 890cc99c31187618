"""Job shapes on Ray and Slurm in one run (docs/shapes.md): creating grouped workers over
many 1-GPU trainers vs creating as many plain workers, and the ready time of a 2-node
instance vs a 1-node worker.

    python benchmarks/run.py --backends shapes [--quick]

Ray: its own 2-node ``ray.cluster_utils`` cluster on this machine with 32 declared GPUs
per node (64 simulated 1-GPU trainers, 16 grouped 4-GPU workers; ``--quick``: 16 and 4).
Run it on its own (not with ``--backends ray``, which holds this process's Ray runtime).
Slurm: the lab cluster of ``bench_slurm`` (4 nodes x 4 gres GPUs: 16 1-GPU trainers, 4
grouped 4-GPU workers; the lab has no more GPUs). Every figure is a ratio to a baseline
of the same run on the same backend.
"""

from __future__ import annotations

import os
import time

from common import BackendUnavailable, Context, Row, hold_lock, log

NAME = "shapes"
RAY_NODES, RAY_GPUS_PER_NODE = 2, 32
GROUP = 4  # GPUs per grouped worker


def check() -> str | None:
    try:
        import ray  # noqa: F401
    except Exception as exc:
        return f"ray cannot be imported: {exc}"
    import bench_slurm

    return bench_slurm.check()


def _cfg(ctx: Context, prefix: str, gpus: int):
    from corral.config import BaseExperimentConfig

    cfg = BaseExperimentConfig(experiment_name=ctx.unique_name(prefix), trial_name="t0")
    cfg.cluster.n_gpus_per_node = gpus
    return cfg


def _timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def grouped_vs_plain(sched, trainers: int) -> tuple[float, float]:
    """Seconds to create trainers/GROUP grouped GROUP-GPU workers over ``trainers`` 1-GPU
    workers, and to create as many plain (launched, CPU-only) workers."""
    from corral import Job, SchedulingSpec, SchedulingStrategy

    n = trainers // GROUP
    one = SchedulingSpec(cpu=0, gpu=1, ray_placement_strategy="shared")  # Ray: PACK
    sched.create_workers(Job(role="actor", replicas=trainers, tasks=[one]))
    plain = _timed(
        lambda: sched.create_workers(
            Job(role="plain", replicas=n, tasks=[SchedulingSpec(cpu=0, gpu=0)])
        )
    )
    grouped = _timed(
        lambda: sched.create_workers(
            Job(
                role="rollout",
                replicas=n,
                tasks=[SchedulingSpec(cpu=0, gpu=GROUP)],
                scheduling_strategy=SchedulingStrategy("colocation", "actor"),
            )
        )
    )
    sched.delete_workers()
    return grouped, plain


def multinode_vs_one(sched, gpus_per_node: int) -> tuple[float, float]:
    """Seconds until a 2-node instance (worker and member registered, node variables
    set) is ready, and until a 1-node worker of the same per-node share is."""
    from corral import Job, SchedulingSpec

    def spec(k: int) -> SchedulingSpec:
        return SchedulingSpec(cpu=2 * k, gpu=k * gpus_per_node, mem=2 * k)

    one = _timed(lambda: sched.create_workers(Job(role="one", replicas=1, tasks=[spec(1)])))
    sched.delete_workers("one")
    two = _timed(lambda: sched.create_workers(Job(role="two", replicas=1, tasks=[spec(2)])))
    sched.delete_workers("two")
    return two, one


def _rows(backend: str, trainers: int, grouped, plain, two, one) -> list[Row]:
    n = trainers // GROUP
    return [
        Row(
            key=f"shapes.{backend}.grouped.n{n}_over_{trainers}",
            backend=NAME,
            label=f"{backend}: create {n} grouped {GROUP}-GPU workers over {trainers} 1-GPU "
            "trainers",
            unit="s",
            value=grouped,
            baseline=plain,
            baseline_label=f"create {n} plain CPU-only workers, same scheduler",
        ),
        Row(
            key=f"shapes.{backend}.multinode.ready",
            backend=NAME,
            label=f"{backend}: ready time of a 2-node instance",
            unit="s",
            value=two,
            baseline=one,
            baseline_label="a 1-node worker with the same per-node share",
        ),
    ]


def _ray(ctx: Context, trainers: int) -> list[Row]:
    from corral.backends.ray.runtime import apply_quiet_env
    from corral.backends.ray.scheduler import RayScheduler

    apply_quiet_env()
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        raise BackendUnavailable("ray is initialised in this process: run --backends shapes alone")
    args = {"num_cpus": 8, "num_gpus": RAY_GPUS_PER_NODE, "object_store_memory": 128 * 1024**2}
    cluster = Cluster(
        initialize_head=True,
        head_node_args={**args, "include_dashboard": False},
    )
    ctx.on_close(cluster.shutdown)
    for _ in range(RAY_NODES - 1):
        cluster.add_node(**args)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    ctx.on_close(ray.shutdown)
    sched = RayScheduler(
        exp_config=_cfg(ctx, "benchshapes", RAY_GPUS_PER_NODE),
        fileroot=ctx.fileroot,
        startup_timeout=600.0,
        progress=lambda t: None,
    )
    ctx.on_close(sched.close)
    grouped, plain = grouped_vs_plain(sched, trainers)
    log(f"shapes/ray: {trainers // GROUP} grouped {grouped:.2f}s, plain {plain:.2f}s")
    two, one = multinode_vs_one(sched, RAY_GPUS_PER_NODE)
    log(f"shapes/ray: 2-node instance {two:.2f}s, 1-node worker {one:.2f}s")
    return _rows("ray", trainers, grouped, plain, two, one)


def _slurm(ctx: Context) -> list[Row]:
    import bench_slurm

    from corral.backends.slurm.scheduler import SlurmScheduler

    hold_lock(ctx, bench_slurm.CLUSTER_LOCK, "slurm")
    gpus = bench_slurm.GPUS_PER_NODE
    trainers = bench_slurm.NODES * gpus
    sched = SlurmScheduler(
        exp_config=_cfg(ctx, "benchshapes", gpus),
        fileroot=ctx.fileroot,
        startup_timeout=600.0,
        progress=lambda t: None,
    )
    ctx.on_close(sched.close)
    grouped, plain = grouped_vs_plain(sched, trainers)
    log(f"shapes/slurm: {trainers // GROUP} grouped {grouped:.2f}s, plain {plain:.2f}s")
    two, one = multinode_vs_one(sched, gpus)
    log(f"shapes/slurm: 2-node instance {two:.2f}s, 1-node worker {one:.2f}s")
    return _rows("slurm", trainers, grouped, plain, two, one)


def run(ctx: Context) -> list[Row]:
    reason = check()
    if reason:
        raise BackendUnavailable(reason)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    rows = _slurm(ctx)
    rows += _ray(ctx, 16 if ctx.quick else 64)
    return rows
