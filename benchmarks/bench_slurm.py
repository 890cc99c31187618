"""corral on Slurm, next to a bare sbatch job and the same figures on the local backend.

Rows (keys ``slurm.*``): cold start of 8 workers spread over 4 nodes (gpu=2 each with
``n_gpus_per_node=4``: 2 workers per node), noop call_engine p50/p99, delete_workers of
those 8 and what is left after it (processes, and jobs of the trial in squeue).

Baselines, measured in the same run: for the cold start, a bare ``sbatch`` of a 4-node
job running ``srun hostname``, timed until the first line appears in its output file
(the queue, allocation and step launch that every corral role pays too); for noop and
delete, the local backend's figures (``NEEDS`` makes run.py measure local first).

It runs against the Slurm cluster the Slurm client commands reach (``SLURM_CONF``; the
lab of ``.ci/slurm_cluster.sh`` by default when its config exists). Every job it submits
is named ``<experiment>:<trial>:...`` or ``corral-bench-baseline`` and is cancelled on
exit, error or Ctrl-C.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time

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
    time_forks,
)

NAME = "slurm"
NEEDS = ["local"]  # the local rows are this backend's baselines
ENGINE = "corral.testing.engines.EchoEngine"
LAB_CONF = os.path.join(
    os.environ.get("CORRAL_SLURM_DIR", "/tmp/corral-slurm"), "etc", "slurm.conf"
)
NODES = 4
GPUS_PER_NODE = 4
GPUS_PER_WORKER = 2
BASELINE_JOB_NAME = "corral-bench-baseline"
CLUSTER_LOCK = "/tmp/corral-slurm.lock"  # every user of the shared test cluster takes it
CLUSTER_SCRIPT = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".ci", "slurm_cluster.sh"
)


def _use_lab_conf() -> None:
    if not os.environ.get("SLURM_CONF") and os.path.exists(LAB_CONF):
        os.environ["SLURM_CONF"] = LAB_CONF


def _ping() -> tuple[bool, str]:
    try:
        r = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"scontrol ping failed: {exc}"
    return "is UP" in r.stdout, (r.stdout + r.stderr).strip() or f"exit code {r.returncode}"


def ensure_cluster() -> None:
    """Start the test cluster (``.ci/slurm_cluster.sh up``) when no slurmctld answers and
    this is the lab's configuration; a full run always measures the Slurm rows."""
    _use_lab_conf()
    if _ping()[0] or os.environ.get("SLURM_CONF") not in (None, LAB_CONF):
        return
    if not os.path.exists(CLUSTER_SCRIPT) or not shutil.which("bash"):
        return
    log("slurm: no slurmctld answers; starting the test cluster (.ci/slurm_cluster.sh up)")
    r = subprocess.run(
        ["bash", CLUSTER_SCRIPT, "up"],
        env={**os.environ, "CORRAL_SLURM_KEEP": "1"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    if r.returncode != 0:
        log(f"slurm: starting the test cluster failed:\n{(r.stdout + r.stderr)[-2000:]}")


def check() -> str | None:
    """Why the Slurm rows cannot run here, or None."""
    try:
        import corral.backends.slurm.scheduler  # noqa: F401
    except Exception as exc:
        return f"corral.backends.slurm.scheduler cannot be imported ({type(exc).__name__}: {exc})"
    missing = [
        c
        for c in ("sbatch", "srun", "squeue", "scontrol", "scancel", "sinfo")
        if not shutil.which(c)
    ]
    if missing:
        return f"Slurm client commands not found: {', '.join(missing)} (not a Slurm login node)"
    _use_lab_conf()
    up, text = _ping()
    if not up:
        return f"slurmctld does not answer `scontrol ping` ({text}); bash .ci/slurm_cluster.sh up"
    nodes = _idle_gpu_nodes()
    if nodes < NODES:
        return (
            f"needs {NODES} nodes with >= {GPUS_PER_NODE} GPUs (gres gpu) each; sinfo shows {nodes}"
        )
    return None


def _idle_gpu_nodes() -> int:
    r = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %G"], capture_output=True, text=True)
    found = set()
    for line in r.stdout.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        for gres in parts[1].split(","):
            if gres.startswith("gpu:"):
                try:
                    if int(gres.split(":")[-1].split("(")[0]) >= GPUS_PER_NODE:
                        found.add(parts[0])
                except ValueError:
                    pass
    return len(found)


class Plan:
    def __init__(self, quick: bool):
        self.workers = 8
        self.cold_reps = 1 if quick else 3
        self.bare_reps = 1 if quick else 3
        self.noop_warmup = 50 if quick else 200
        self.noop_calls = 300 if quick else 2000
        self.fork_reps = 2 if quick else 5


# ------------------------------------------------------------------ baseline --
def _scancel(job_id: str) -> None:
    subprocess.run(["scancel", job_id], capture_output=True)


def _wait_gone(job_id: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = subprocess.run(
            ["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True
        )
        if r.returncode != 0 or not r.stdout.strip():
            return
        time.sleep(0.1)


def bare_sbatch_srun(ctx: Context, rep: int, tasks: int) -> float:
    """Seconds from ``sbatch`` of a 4-node job whose ``srun`` starts ``tasks`` x
    ``python -c pass`` (as many per node as corral's workers) until that step has ended."""
    folder = os.path.join(ctx.fileroot, "slurm-baseline")
    os.makedirs(folder, exist_ok=True)
    out = os.path.join(folder, f"pass-{rep}.out")
    script = os.path.join(folder, f"pass-{rep}.sbatch")
    with open(script, "w") as fh:
        fh.write(
            "#!/bin/bash\n"
            f"#SBATCH --job-name={BASELINE_JOB_NAME}\n"
            f"#SBATCH --output={out}\n"
            f"#SBATCH --nodes={NODES}\n"
            f"#SBATCH --ntasks={tasks}\n"
            f"#SBATCH --ntasks-per-node={tasks // NODES}\n"
            "#SBATCH --cpus-per-task=1\n"
            "#SBATCH --no-requeue\n"
            f"srun {sys.executable} -c pass\n"
            "echo done\n"
        )
    started = time.perf_counter()
    r = subprocess.run(["sbatch", "--parsable", script], capture_output=True, text=True)
    job_id = r.stdout.strip().split(";")[0]
    if r.returncode != 0 or not job_id.isdigit():
        raise RuntimeError(f"sbatch of the baseline job failed: {r.stderr.strip()}")
    ctx.on_close(_scancel, job_id)
    deadline = time.monotonic() + 120
    while True:
        try:
            with open(out) as fh:
                if "done" in fh.read():
                    break
        except FileNotFoundError:
            pass
        if time.monotonic() > deadline:
            _scancel(job_id)
            raise RuntimeError(f"baseline job {job_id} did not finish srun in 120 s ({out})")
        time.sleep(0.005)
    elapsed = time.perf_counter() - started
    _wait_gone(job_id)
    return elapsed


# -------------------------------------------------------------------- corral --
def _scheduler(ctx: Context):
    from corral.backends.slurm.scheduler import SlurmScheduler
    from corral.config import BaseExperimentConfig

    cfg = BaseExperimentConfig(experiment_name=ctx.unique_name("benchslurm"), trial_name="t0")
    cfg.cluster.n_gpus_per_node = GPUS_PER_NODE  # a config's value wins over the keyword
    sched = SlurmScheduler(
        exp_config=cfg,
        fileroot=ctx.fileroot,
        startup_timeout=180.0,
        progress=lambda text: None,
    )
    ctx.on_close(sched.close)
    return sched


def _job(role: str, replicas: int):
    from corral import Job, SchedulingSpec

    return Job(role=role, replicas=replicas, tasks=[SchedulingSpec(cpu=1, gpu=GPUS_PER_WORKER)])


def _trial_jobs(sched) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i %j %T"], capture_output=True, text=True)
    prefix = f"{sched.experiment_name}:{sched.trial_name}:"
    return [
        line
        for line in out.stdout.splitlines()
        if len(line.split()) > 1 and line.split()[1].startswith(prefix)
    ]


def _timed_delete(sched, role: str) -> tuple[float, dict]:
    pids = [w.pid for w in sched.get_workers(role) if w.pid]
    started = time.perf_counter()
    sched.delete_workers(role)
    elapsed = time.perf_counter() - started
    procs = processes_left(pids)
    jobs = _trial_jobs(sched)
    return elapsed, {**procs, "slurm_jobs": jobs, "left": procs["left"] + len(jobs)}


def _local(ctx: Context, key: str) -> tuple[float | None, str]:
    row = ctx.row(key)
    if row is None:
        return None, "local backend (not measured in this run)"
    return row.value, "local backend, same run"


def run(ctx: Context) -> list[Row]:
    hold_lock(ctx, CLUSTER_LOCK, "slurm")
    ensure_cluster()
    reason = check()
    if reason:
        raise BackendUnavailable(reason)
    plan = Plan(ctx.quick)
    n = plan.workers
    sched = _scheduler(ctx)

    async def engines(ids: list[str]) -> None:
        await asyncio.gather(*(sched.create_engine(i, ENGINE) for i in ids))

    bare = [bare_sbatch_srun(ctx, rep, n) for rep in range(plan.bare_reps)]
    log(f"slurm: bare sbatch + srun of {n} x python -c pass on {NODES} nodes: {rounded(bare, 3)}")
    cold: list[float] = []
    deletes: list[float] = []
    lefts: list[dict] = []
    hosts: list[int] = []
    ids: list[str] = []
    role = ""
    for rep in range(plan.cold_reps):
        role = f"slurm{n}-r{rep}"
        started = time.perf_counter()
        ids = sched.create_workers(_job(role, n))
        cold.append(time.perf_counter() - started)
        hosts.append(len({w.host for w in sched.get_workers(role)}))
        asyncio.run(engines(ids))
        log(f"slurm: cold start of {n} rep {rep}: {cold[-1]:.2f}s on {hosts[-1]} node(s)")
        if rep < plan.cold_reps - 1:
            seconds, left = _timed_delete(sched, role)
            deletes.append(seconds)
            lefts.append(left)

    for _ in range(plan.noop_warmup):
        sched.call_engine(ids[0], "noop")
    lat = []
    for _ in range(plan.noop_calls):
        started = time.perf_counter()
        sched.call_engine(ids[0], "noop")
        lat.append(time.perf_counter() - started)
    ms = [x * 1e3 for x in lat]
    log(f"slurm: noop p50 {percentile(ms, 50):.3f} ms, p99 {percentile(ms, 99):.3f} ms")

    fork_s = time_forks(sched, plan.fork_reps, cpu=1)
    log(f"slurm: fork of one worker next to a worker: {rounded(fork_s, 3)}")

    seconds, left = _timed_delete(sched, role)
    deletes.append(seconds)
    lefts.append(left)
    log(f"slurm: delete of {n}: {rounded(deletes, 3)}; left {[x['left'] for x in lefts]}")

    local_p50, local_label = _local(ctx, "local.noop.p50")
    local_p99, local_p99_label = _local(ctx, "local.noop.p99")
    local_delete, local_delete_label = _local(ctx, f"local.delete.n{n}")
    local_fork, local_fork_label = _local(ctx, "local.fork.n1")
    return [
        Row(
            key="slurm.fork.n1",
            backend=NAME,
            label="Slurm: fork_workers, one forked worker ready next to its target",
            unit="s",
            value=median(fork_s),
            baseline=local_fork,
            baseline_label=local_fork_label,
            samples={"corral": rounded(fork_s)},
        ),
        Row(
            key=f"slurm.cold_start.n{n}",
            backend=NAME,
            label=f"Slurm: cold start, {n} workers (gpu={GPUS_PER_WORKER}) on {NODES} nodes ready",
            unit="s",
            value=median(cold),
            baseline=median(bare),
            baseline_label=f"bare sbatch + srun of {n} x `python -c pass` on {NODES} nodes, "
            "until the step ended",
            samples={"corral": rounded(cold), "baseline": rounded(bare)},
            extra={"distinct_nodes": hosts},
        ),
        Row(
            key="slurm.noop.p50",
            backend=NAME,
            label="Slurm: noop call_engine p50",
            unit="ms",
            value=percentile(ms, 50),
            baseline=local_p50,
            baseline_label=local_label,
            samples={"corral": rounded(ms, 4)},
        ),
        Row(
            key="slurm.noop.p99",
            backend=NAME,
            label="Slurm: noop call_engine p99",
            unit="ms",
            value=percentile(ms, 99),
            baseline=local_p99,
            baseline_label=local_p99_label,
        ),
        Row(
            key=f"slurm.delete.n{n}",
            backend=NAME,
            label=f"Slurm: delete_workers, {n} workers with an engine each",
            unit="s",
            value=median(deletes),
            baseline=local_delete,
            baseline_label=local_delete_label,
            samples={"corral": rounded(deletes)},
        ),
        Row(
            key=f"slurm.delete.n{n}.left",
            backend=NAME,
            label=f"Slurm: processes and jobs left after delete of {n}",
            unit="processes+jobs",
            value=float(max(x["left"] for x in lefts)),
            baseline=0.0,
            baseline_label="none expected",
            targets=[Target("abs", "==", 0.0, "0 left")],
            extra={"detail": lefts},
        ),
    ]
