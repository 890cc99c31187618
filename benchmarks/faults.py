"""Time to detect faults, per backend: a worker SIGKILLed mid-call, a SIGSTOPped worker
against the caller's deadline, and a controller SIGKILLed (time until every worker and
forked child is gone). Baseline for the first: the same call on a worker that exits by
itself (``os._exit``), i.e. the fastest a broken connection can be noticed.

Long-job faults (benchmarks/faults_long.py): a death noticed by the health monitor with no
call in flight, a request that can never fit, a second live controller, a rerun after a
frozen controller, a chatty worker on a full log disk (baseline: the same call on a
writable disk), the open-file limit (local), and on Slurm a restart inside the allocation,
a slurmctld outage and a preemption (requeue); on Ray a node loss, a drain (time to
``on_preempt``) and a raylet death (benchmarks/faults_ray.py; baseline: ``close()`` of a
healthy worker). docs/reliability.md tabulates one run.

    python benchmarks/faults.py [--backends local,ray,slurm] [--out benchmarks/results/faults.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

import faults_long as L  # noqa: N812  (benchmarks/ is on sys.path when run as a script)
from faults_ray import ray_node_faults

from corral import BaseExperimentConfig, Job, SchedulingSpec, make_scheduler
from corral.errors import WorkerFailedError, WorkerTimeoutError
from corral.procs import pid_alive

ECHO = "corral.testing.engines.EchoEngine"
HERE = os.path.dirname(os.path.abspath(__file__))
CONTROLLER = os.path.join(os.path.dirname(HERE), "tests", "conformance", "controller_script.py")


RAY_CLUSTER: list = []  # the tests' Ray cluster (nodes can be added and removed)


def scheduler(backend: str, root: str, trial: str, **kwargs):
    cfg = BaseExperimentConfig(experiment_name=f"faults-{backend}", trial_name=trial)
    cfg.scheduler.type = backend
    cfg.cluster.fileroot = root
    cfg.cluster.n_gpus_per_node = 4
    if backend == "local":
        kwargs.setdefault("gpu_devices", [0, 1, 2, 3])
    return make_scheduler(cfg, progress=lambda _t: None, **kwargs)


def detect_kill(sched, role: str, self_exit: bool) -> float:
    (wid,) = sched.create_workers(Job(role=role, replicas=1, tasks=[SchedulingSpec(cpu=1)]))
    asyncio.run(sched.create_engine(wid, ECHO, "e"))
    worker = sched.get_workers(role)[0]
    killed_at: list[float] = []
    if self_exit:
        killed_at.append(time.monotonic())
        call = ("exit_now", (9,))
    else:

        def kill() -> None:
            killed_at.append(time.monotonic())
            os.kill(worker.pid, signal.SIGKILL)

        threading.Timer(0.3, kill).start()
        call = ("sleep", (60,))
    try:
        sched.call_engine(wid, call[0], "e", *call[1], rpc_meta={"timeout": 60})
    except WorkerFailedError:
        return time.monotonic() - killed_at[0]
    finally:
        sched.delete_workers(role)
    raise AssertionError("the call did not fail")


def stop_deadline(sched, role: str, deadline: float) -> float:
    (wid,) = sched.create_workers(Job(role=role, replicas=1, tasks=[SchedulingSpec(cpu=1)]))
    asyncio.run(sched.create_engine(wid, ECHO, "e"))
    worker = sched.get_workers(role)[0]
    os.kill(worker.pid, signal.SIGSTOP)
    t = time.monotonic()
    try:
        sched.call_engine(wid, "noop", "e", rpc_meta={"timeout": deadline})
    except WorkerTimeoutError:
        return time.monotonic() - t
    finally:
        os.kill(worker.pid, signal.SIGCONT)
        sched.delete_workers(role)
    raise AssertionError("no timeout")


def controller_death(backend: str, root: str, trial: str) -> float:
    proc = subprocess.Popen(
        [sys.executable, CONTROLLER, backend, root, f"faults-{backend}", trial, "4"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    pids = json.loads(proc.stdout.readline())["pids"]
    proc.kill()
    proc.wait()
    t = time.monotonic()
    while any(pid_alive(p) for p in pids):
        if time.monotonic() - t > 30:
            return float("inf")
        time.sleep(0.02)
    return time.monotonic() - t


def run(backend: str, root: str, repeats: int) -> dict:
    sched = scheduler(backend, root, f"t{os.getpid()}")
    try:
        kills = [detect_kill(sched, f"k{i}", False) for i in range(repeats)]
        exits = [detect_kill(sched, f"x{i}", True) for i in range(repeats)]
        stops = [stop_deadline(sched, f"s{i}", 1.0) for i in range(repeats)]
        monitor = [L.health_monitor_detect(sched, f"h{i}") for i in range(repeats)]
        refused = [L.never_fits(sched, backend, f"n{i}") for i in range(repeats)]
        creates = [L.create_one(sched, f"c{i}") for i in range(repeats)]
        chatty_full = [L.chatty_call(sched, f"f{i}", True) for i in range(repeats)]
        chatty_ok = [L.chatty_call(sched, f"o{i}", False) for i in range(repeats)]
    finally:
        sched.close()
    death = controller_death(backend, root, f"c{os.getpid()}")

    def make(trial: str, **kw):
        return scheduler(backend, root, trial, **kw)

    clash = L.second_controller(make, backend, root, f"clash{os.getpid()}")
    rerun = L.rerun_after_dead_controller(make, backend, root, f"rerun{os.getpid()}")
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    out = {
        "sigkill_mid_call_detect_s": round(med(kills), 3),
        "self_exit_detect_s (baseline)": round(med(exits), 3),
        "ratio": round(med(kills) / max(med(exits), 1e-3), 2),
        "sigstop_timeout_at_1s_deadline_s": round(med(stops), 3),
        "controller_sigkill_all_gone_s": round(death, 2),
        "death_without_call_to_callback_s": round(med(monitor), 3),
        "never_fits_refused_s": round(med(refused), 4),
        "create_one_worker_s (baseline)": round(med(creates), 3),
        "second_live_controller_refused_s": round(clash, 4),
        "rerun_after_dead_controller_create_s": round(rerun["s"], 3),
        "rerun_removed_leftovers": rerun["removed"],
        "rerun_old_pids_left": rerun["old_pids_left"],
        "chatty_2MB_call_full_log_disk_s": round(med(chatty_full), 3),
        "chatty_2MB_call_writable_log_s (baseline)": round(med(chatty_ok), 3),
    }
    attach = L.reattach(make, backend, root, f"attach{os.getpid()}")  # Ray: detached actors
    out["reattach_after_controller_sigkill_s"] = round(attach["s"], 3)
    out["reattach_workers_lost_before_attach"] = attach["lost_before_attach"]
    if backend == "ray" and RAY_CLUSTER:
        lost = L.ray_node_loss(make, RAY_CLUSTER[0].cluster, 4)
        out["ray_node_loss_to_preempted_error_s"] = round(lost["preempted_error_s"], 3)
        out["ray_node_back_wait_role_s"] = round(lost["back_after_node_joins_s"], 3)
        faults = ray_node_faults(make, RAY_CLUSTER[0].cluster, 4)
        out.update({f"ray_{k}": round(v, 3) for k, v in faults.items()})
    if backend == "local":
        out["fd_limit_refused_s (60 workers, ulimit -n 200)"] = round(L.fd_limit_refusal(root), 4)
    if backend == "slurm":
        sched = scheduler(backend, root, f"slurm{os.getpid()}")
        try:
            out["restart_in_allocation_s"] = round(L.slurm_in_allocation_restart(sched), 3)
            outage = L.slurmctld_outage(sched)
            out["slurmctld_down_get_workers_max_s"] = round(outage["get_workers_max_s"], 3)
            out["slurmctld_down_call_max_s"] = round(outage["call_max_s"], 3)
        finally:
            sched.close()
        sched = scheduler(backend, root, f"spot{os.getpid()}", requeue=True)
        try:
            pre = L.slurm_preemption(sched)
            out["requeue_to_preempted_error_s"] = round(pre["preempted_error_s"], 3)
            out["requeued_role_back_after_release_s"] = round(pre["back_after_release_s"], 3)
        finally:
            sched.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backends", default="local")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "faults.json"))
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="corral-faults-")
    backends = [b for b in args.backends.split(",") if b]
    if "ray" in backends:  # the tests' 2-node cluster (4 declared GPUs each), shared by
        sys.path.insert(0, os.path.dirname(HERE))  # this process and its controllers
        from tests.conformance.backend_ray import acquire_cluster

        RAY_CLUSTER.append(acquire_cluster())
        os.environ["RAY_ADDRESS"] = RAY_CLUSTER[0].address
    if "slurm" in backends:
        os.environ.setdefault("SLURM_CONF", "/tmp/corral-slurm/etc/slurm.conf")
    results = {b: run(b, root, args.repeats) for b in backends}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(results, fh, indent=2)
    keys = list(next(iter(results.values())))
    print("| backend | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for b, r in results.items():
        print(f"| {b} | " + " | ".join(str(r[k]) for k in keys) + " |")


if __name__ == "__main__":
    main()
