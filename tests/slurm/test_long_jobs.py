"""Long jobs on the Slurm lab cluster: requests that can never run are refused at once
with Slurm's reason; requests that wait for busy GPUs say why while they wait.

Declared GPUs (gres backed by dummy devices) are the only fake part."""

from __future__ import annotations

import subprocess
import threading
import time

import pytest

from corral import Job, PlacementError, SchedulingSpec
from tests.conformance.backend_slurm import lab_nodes, squeue_state, trial_jobs
from tests.slurm.test_slurm_backend import lab, make  # noqa: F401


def cpu_job(role: str, replicas: int = 1, **kw) -> Job:
    return Job(role=role, replicas=replicas, tasks=[SchedulingSpec(cpu=1, **kw)])


@pytest.mark.slurm
def test_partition_node_limit_is_refused_with_the_reason_not_a_timeout(make, lab):  # noqa: F811
    sched = make(startup_timeout=600)
    sched.launcher.cluster.inventory = {}  # skip the sinfo check: let Slurm queue it and say why
    with pytest.raises(PlacementError) as info:
        sched.create_workers(
            Job(role="wide", replicas=lab_nodes() + 1, tasks=[SchedulingSpec(cpu=1, gpu=lab)])
        )
    # Slurm 22.05 says PartitionConfig or PartitionNodeLimit for this request; neither clears
    assert "PartitionNodeLimit" in str(info.value) or "PartitionConfig" in str(info.value)
    assert "PENDING" in str(info.value) and "cancelled" in str(info.value)
    assert sched.roles == []
    assert trial_jobs(sched.experiment_name, sched.trial_name) == []


@pytest.mark.slurm
def test_more_nodes_than_the_partition_has_is_refused_before_sbatch(make, lab):  # noqa: F811
    sched = make(startup_timeout=600)
    with pytest.raises(PlacementError) as info:
        sched.create_workers(
            Job(role="wide", replicas=lab_nodes() + 1, tasks=[SchedulingSpec(cpu=1, gpu=lab)])
        )
    assert f"needs {lab_nodes() + 1} node(s)" in str(info.value)
    assert sched.launcher.job_ids("wide") == []


@pytest.mark.slurm
@pytest.mark.parametrize(
    "option, words",
    [
        ({"partition": "nopart"}, ["nopart", "no partition", "debug"]),
        ({"nodelist": "node9"}, ["Invalid node name"]),
        ({"sbatch_directives": ["--gres=tpu:1"]}, ["gres"]),
    ],
    ids=["unknown-partition", "nonexistent-node", "unknown-gres"],
)
def test_names_that_do_not_exist_are_refused_with_the_reason(make, option, words):  # noqa: F811
    sched = make(startup_timeout=600, **option)
    with pytest.raises(PlacementError) as info:
        sched.create_workers(cpu_job("nowhere"))
    for word in words:
        assert word in str(info.value)
    assert trial_jobs(sched.experiment_name, sched.trial_name) == []


@pytest.mark.slurm
@pytest.mark.timeout(120)
def test_waiting_for_busy_gpus_shows_the_pending_reason_then_starts(make, lab, tmp_path):  # noqa: F811
    n_nodes = lab_nodes()
    hog = subprocess.run(
        ["sbatch", "--parsable", f"-N{n_nodes}", f"--gres=gpu:{lab}", "-J", "corral-test-hog",
         "-o", str(tmp_path / "hog.out"), "--wrap", "sleep 300"],
        capture_output=True, text=True, check=True,
    ).stdout.strip().split(";")[0]  # fmt: skip
    lines: list[str] = []
    result: dict = {}
    try:
        deadline = time.monotonic() + 30
        while squeue_state(hog) != "RUNNING" and time.monotonic() < deadline:
            time.sleep(0.1)
        sched = make(startup_timeout=90, progress=lines.append)

        def create():
            try:
                result["ids"] = sched.create_workers(cpu_job("patient", gpu=1))
            except Exception as exc:  # reported below
                result["error"] = exc

        thread = threading.Thread(target=create)
        thread.start()
        deadline = time.monotonic() + 60
        while not any("PENDING (Resources)" in line for line in lines):
            assert thread.is_alive(), result
            assert time.monotonic() < deadline, lines
            time.sleep(0.1)
    finally:
        subprocess.run(["scancel", hog])
    thread.join(90)
    assert result.get("ids") == ["patient/0"], result
    waiting = [line for line in lines if "PENDING (Resources)" in line]
    assert waiting[0].startswith("waiting for patient (0/1 ready)")


@pytest.mark.slurm
@pytest.mark.timeout(180)
def test_a_slurmctld_outage_does_not_fail_healthy_workers(make):  # noqa: F811
    import asyncio
    import os
    import signal

    from corral import WorkerFailedError
    from tests.slurm.lab_ctl import slurmctld_down

    deaths: list[str] = []
    sched = make(on_worker_death=lambda wid, exit_: deaths.append(wid))
    ids = sched.create_workers(cpu_job("steady", 2))
    for wid in ids:
        asyncio.run(sched.create_engine(wid, "corral.testing.engines.EchoEngine", "e"))
    with slurmctld_down():
        # the cluster manager is gone; the workers are not
        assert [w.id for w in sched.get_workers("steady")] == ids
        for _ in range(3):
            assert sched.call_engine(ids[0], "echo", "e", 1) == 1
            assert sched.get_workers("steady")
        # a real death during the outage is still seen (from the worker's exit file)
        victim = sched.get_workers("steady")[1]
        os.kill(victim.pid, signal.SIGKILL)
        with pytest.raises(WorkerFailedError):
            sched.call_engine(ids[1], "echo", "e", 2)
        assert sched.call_engine(ids[0], "echo", "e", 3) == 3
    assert sched.call_engine(ids[0], "echo", "e", 4) == 4
    assert deaths in ([], [ids[1]])  # only the killed worker, never the healthy one


def _sbatch_hog(tmp_path, name: str, *args: str) -> str:
    return subprocess.run(
        ["sbatch", "--parsable", "-J", f"corral-test-{name}", "-o", str(tmp_path / f"{name}.out"),
         *args, "--wrap", "sleep 300"],
        capture_output=True, text=True, check=True,
    ).stdout.strip().split(";")[0]  # fmt: skip


@pytest.mark.slurm
@pytest.mark.timeout(120)
def test_a_restart_that_must_queue_on_a_full_cluster_fails_with_the_pending_reason(
    make,  # noqa: F811
    lab,  # noqa: F811
    tmp_path,
):
    """The fallback of restarts inside the allocation: the replica's job itself ended
    (scancel), so the restart is a new job; the cluster is full (one hog on every other
    node, a second hog queued first for the replica's node), so the new job pends. The
    caller gets Slurm's pending reason in the error, not a bare timeout, and later calls
    say the worker could not be restarted."""
    import asyncio

    from corral import WorkerFailedError

    if lab < 1 or lab_nodes() < 2:
        pytest.skip("needs at least 2 lab nodes with GPUs")
    sched = make(startup_timeout=4)
    (wid,) = sched.create_workers(
        Job(role="phoenix", replicas=1, tasks=[SchedulingSpec(cpu=1, gpu=lab, max_restarts=1)])
    )
    asyncio.run(sched.create_engine(wid, "corral.testing.engines.EchoEngine", "e"))
    node = sched.get_workers("phoenix")[0].host
    hogs = [
        _sbatch_hog(tmp_path, "hog-rest", f"-N{lab_nodes() - 1}", f"--gres=gpu:{lab}",
                    f"--exclude={node}"),
        _sbatch_hog(tmp_path, "hog-next", "-N1", f"--gres=gpu:{lab}", f"--nodelist={node}"),
    ]  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while squeue_state(hogs[0]) != "RUNNING" or squeue_state(hogs[1]) != "PENDING":
            assert time.monotonic() < deadline, [squeue_state(h) for h in hogs]
            time.sleep(0.1)
        subprocess.run(["scancel", sched.launcher_jobs["phoenix"]], check=True)
        with pytest.raises(WorkerFailedError) as info:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # until the death is seen
                sched.call_engine(wid, "echo", "e", 1, rpc_meta={"timeout": 5})
                time.sleep(0.2)
        message = str(info.value)
        assert "PENDING (" in message, message  # Slurm's reason: Resources or Priority
        assert "Resources" in message or "Priority" in message, message
        with pytest.raises(WorkerFailedError, match="could not be restarted"):
            sched.call_engine(wid, "echo", "e", 2)
    finally:
        subprocess.run(["scancel", *hogs])
