"""Long-job faults (issue 13), timed per backend; used by benchmarks/faults.py.

Each function returns seconds (or a small dict) for one backend. Baselines are measured
in the same run: a plain ``create_workers`` of one worker (what a refusal or a restart is
compared with) and a chatty call on a writable log (what the same call costs when the log
disk is full).
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time

from corral import Job, PlacementError, SchedulingSpec, TrialInUseError
from corral.errors import WorkerFailedError, WorkerPreemptedError
from corral.procs import pid_alive

ECHO = "corral.testing.engines.EchoEngine"
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CONTROLLER = os.path.join(ROOT, "tests", "conformance", "controller_script.py")
CLUSTER = {"local": (1, 4), "ray": (2, 4), "slurm": (4, 4)}  # nodes, GPUs per node


def cpu_job(role: str, replicas: int = 1) -> Job:
    return Job(role=role, replicas=replicas, tasks=[SchedulingSpec(cpu=1)])


def create_one(sched, role: str) -> float:
    t = time.monotonic()
    sched.create_workers(cpu_job(role))
    return time.monotonic() - t


def health_monitor_detect(sched, role: str) -> float:
    """SIGKILL with no call in flight -> the on_worker_death callback."""
    seen = threading.Event()
    sched.on_worker_death(lambda wid, exit_: seen.set() if wid == f"{role}/0" else None)
    sched.create_workers(cpu_job(role))
    worker = sched.get_workers(role)[0]
    t = time.monotonic()
    os.kill(worker.pid, signal.SIGKILL)
    if not seen.wait(60):
        raise AssertionError("the monitor did not report the death")
    took = time.monotonic() - t
    sched.delete_workers(role)
    return took


def never_fits(sched, backend: str, role: str) -> float:
    nodes, gpus = CLUSTER[backend]
    t = time.monotonic()
    try:
        sched.create_workers(
            Job(role=role, replicas=nodes * gpus + 1, tasks=[SchedulingSpec(cpu=1, gpu=1)])
        )
    except PlacementError:
        return time.monotonic() - t
    raise AssertionError("an impossible request was accepted")


def chatty_call(sched, role: str, full_disk: bool) -> float:
    """One call that prints 2 MB, its replica log on /dev/full (ENOSPC) or on disk."""
    from corral.logs import replica_log_path

    if full_disk:
        path = replica_log_path(sched.log_dir, role, 0)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.symlink("/dev/full", path)
    (wid,) = sched.create_workers(cpu_job(role))
    asyncio.run(sched.create_engine(wid, ECHO, "e"))
    sched.call_engine(wid, "chatter", "e", 100)
    t = time.monotonic()
    sched.call_engine(wid, "chatter", "e", 20000, rpc_meta={"timeout": 60})
    took = time.monotonic() - t
    sched.delete_workers(role)
    return took


def _controller(
    backend: str,
    root: str,
    experiment: str,
    trial: str,
    lease: float | None,
    outlive: float | None = None,
):
    argv = [sys.executable, CONTROLLER, backend, root, experiment, trial, "4"]
    if lease is not None or outlive is not None:
        argv.append(str(lease if lease is not None else 5.0))
    if outlive is not None:
        argv.append(str(outlive))
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return proc, json.loads(proc.stdout.readline())


def second_controller(make, backend: str, root: str, trial: str) -> float:
    """A live controller holds the trial: time until the second one is refused."""
    experiment = f"faults-{backend}"
    proc, _ = _controller(backend, root, experiment, trial, None)
    sched = make(trial)
    try:
        t = time.monotonic()
        try:
            sched.create_workers(cpu_job("w"))
        except TrialInUseError:
            return time.monotonic() - t
        raise AssertionError("the second controller was not refused")
    finally:
        sched.close()
        proc.kill()
        proc.wait()


def rerun_after_dead_controller(make, backend: str, root: str, trial: str) -> dict:
    """The old controller froze (lease stale, workers told to wait 600 s): time for the
    rerun's create_workers, which first removes the old run's workers."""
    experiment = f"faults-{backend}"
    proc, first = _controller(backend, root, experiment, trial, 600)
    proc.send_signal(signal.SIGSTOP)
    time.sleep(2.5)  # older than the rerun's lease timeout (1 s) + 1 s
    sched = make(trial, lease_timeout=1.0)
    try:
        t = time.monotonic()
        sched.create_workers(cpu_job("orphan", 2))
        took = time.monotonic() - t
        removed = len(sched.removed_leftovers)
    finally:
        sched.close()
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.wait()
    return {
        "s": took,
        "removed": removed,
        "old_pids_left": sum(pid_alive(p) for p in first["pids"]),
    }


def fd_limit_refusal(root: str) -> float:
    """Local: 60 workers under `ulimit -n 200` (hard too): time to ResourceLimitError."""
    code = (
        "import sys, time\n"
        "from corral import LocalScheduler, BaseExperimentConfig, Job, SchedulingSpec\n"
        "from corral.errors import ResourceLimitError\n"
        "s = LocalScheduler(exp_config=BaseExperimentConfig(experiment_name='fds', trial_name='t'),"
        " fileroot=sys.argv[1], gpu_devices=[], progress=lambda t: None)\n"
        "t = time.monotonic()\n"
        "try:\n"
        "    s.create_workers(Job(role='m', replicas=60, tasks=[SchedulingSpec(cpu=1)]))\n"
        "except ResourceLimitError:\n"
        "    print(time.monotonic() - t)\n"
        "s.close()\n"
    )

    def limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (200, 200))

    r = subprocess.run(
        [sys.executable, "-c", code, root], capture_output=True, text=True, preexec_fn=limit
    )
    return float(r.stdout.strip())


def slurm_in_allocation_restart(sched) -> float:
    """Kill one of two replicas (max_restarts=1): time until the call that saw the death
    returns with the replica restarted as a step of the same job."""
    ids = sched.create_workers(
        Job(role="phoenix", replicas=2, tasks=[SchedulingSpec(cpu=1, max_restarts=1)])
    )
    asyncio.run(sched.create_engine(ids[1], ECHO, "e"))
    victim = sched.get_workers("phoenix")[1]
    t = time.monotonic()
    os.kill(victim.pid, signal.SIGKILL)
    try:
        sched.call_engine(ids[1], "noop", "e")
    except WorkerFailedError as exc:
        assert exc.restarted, exc
    took = time.monotonic() - t
    sched.delete_workers("phoenix")
    return took


def slurmctld_outage(sched) -> dict:
    """get_workers and a call while slurmctld is down (worst of 5 each)."""
    sys.path.insert(0, ROOT)
    from tests.slurm.lab_ctl import slurmctld_down

    (wid,) = sched.create_workers(cpu_job("steady"))
    asyncio.run(sched.create_engine(wid, ECHO, "e"))
    gets, calls = [], []
    with slurmctld_down():
        for _ in range(5):
            t = time.monotonic()
            sched.get_workers("steady")
            gets.append(time.monotonic() - t)
            t = time.monotonic()
            sched.call_engine(wid, "echo", "e", 1)
            calls.append(time.monotonic() - t)
    sched.delete_workers("steady")
    return {"get_workers_max_s": max(gets), "call_max_s": max(calls)}


def slurm_preemption(sched) -> dict:
    """scontrol requeue -> WorkerPreemptedError; release -> wait_role returns."""
    sched.create_workers(cpu_job("spot", 2))
    job = sched.launcher_jobs["spot"]
    t = time.monotonic()
    subprocess.run(["scontrol", "requeue", job], check=True)
    while True:
        try:
            sched.get_workers("spot")
        except WorkerPreemptedError:
            break
        time.sleep(0.02)
    seen = time.monotonic() - t
    while (
        subprocess.run(
            ["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True
        ).stdout.strip()
        != "PENDING"
    ):
        time.sleep(0.05)
    subprocess.run(["scontrol", "update", f"jobid={job}", "StartTime=now"], check=True)
    t = time.monotonic()
    sched.wait_role("spot", timeout=120)
    back = time.monotonic() - t
    sched.delete_workers("spot")
    return {"preempted_error_s": seen, "back_after_release_s": back}


def reattach(make, backend: str, root: str, trial: str) -> dict:
    """A controller with ``outlive_controller=120`` is SIGKILLed; its 4 workers (2 + 2
    forked) keep running; time for ``Scheduler(attach=True)`` to adopt them and answer a
    call, and whether any worker was lost meanwhile."""
    experiment = f"faults-{backend}"
    proc, first = _controller(backend, root, experiment, trial, 1.0, outlive=120)
    proc.kill()
    proc.wait()
    time.sleep(2.5)  # past the lease timeout (1 s): fail-fast workers would have left
    lost = sum(not pid_alive(p) for p in first["pids"])
    t = time.monotonic()
    sched = make(trial, lease_timeout=1.0, attach=True)
    try:
        sched.health("orphan/0")
        took = time.monotonic() - t
    finally:
        sched.close()
    return {"s": took, "lost_before_attach": lost}


def ray_node_loss(make, cluster, gpus_per_node: int) -> dict:
    """``requeue=True``: a worker's node is removed -> WorkerPreemptedError; a new node
    joins -> ``wait_role`` returns the worker (new generation)."""
    from corral.errors import WorkerPreemptedError as Preempted

    hog = make(f"hog{os.getpid()}")
    hog.create_workers(
        Job(role="hog", replicas=2, tasks=[SchedulingSpec(cpu=1, gpu=gpus_per_node)])
    )
    added = [cluster.add_node(num_cpus=2, num_gpus=gpus_per_node)]
    try:
        cluster.wait_for_nodes()
        sched = make(f"node{os.getpid()}", requeue=True)
        sched.create_workers(Job(role="learner", replicas=1, tasks=[SchedulingSpec(gpu=1)]))
        t = time.monotonic()
        cluster.remove_node(added.pop())
        while True:
            try:
                sched.get_workers("learner")  # asks the backend whether they live
            except Preempted:
                break
            except Exception:
                pass
            time.sleep(0.02)
        seen = time.monotonic() - t
        added.append(cluster.add_node(num_cpus=2, num_gpus=gpus_per_node))
        t = time.monotonic()
        sched.wait_role("learner", timeout=120)
        back = time.monotonic() - t
        sched.close()
    finally:
        hog.close()
        for node in added:
            cluster.remove_node(node)
    return {"preempted_error_s": seen, "back_after_node_joins_s": back}
