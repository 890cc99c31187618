"""SlurmScheduler on the real lab cluster (.ci/slurm_cluster.sh), plus its pure parts."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from corral import (
    BaseExperimentConfig,
    ConfigError,
    Job,
    SchedulingSpec,
    WorkerCreationError,
    WorkerFailedError,
    WorkerTimeoutError,
)
from corral.backends.slurm.job_files import ending_state_from_log, exit_code_path
from corral.backends.slurm.queue import (
    ACTIVE,
    ENDED,
    PENDING,
    UNKNOWN,
    classify_state,
    describe_state,
    normalize_state,
    parse_exit_code,
    state_is_final,
)
from corral.backends.slurm.scheduler import SlurmScheduler
from tests.conformance.backend_slurm import (
    lab_gpus_per_node,
    slurm_conf,
    slurm_reachable,
    squeue_state,
    trial_jobs,
)
from tests.conformance.harness import pid_alive, require_service

ROOT = Path(__file__).resolve().parents[2]
ECHO = "corral.testing.engines.EchoEngine"


# ------------------------------------------------------------- pure parts --
@pytest.mark.parametrize(
    "state, kind, final",
    [
        ("PENDING", PENDING, False),
        ("CONFIGURING", PENDING, False),
        ("REQUEUED", PENDING, False),
        ("RUNNING", ACTIVE, False),
        ("SUSPENDED", ACTIVE, False),
        ("COMPLETING", ENDED, False),
        ("COMPLETED", ENDED, True),
        ("FAILED", ENDED, True),
        ("CANCELLED", ENDED, True),
        ("CANCELLED by 0", ENDED, True),
        ("cancelled+", ENDED, True),
        ("TIMEOUT", ENDED, True),
        ("NODE_FAIL", ENDED, True),
        ("PREEMPTED", ENDED, True),
        ("OUT_OF_MEMORY", ENDED, True),
        ("BOOT_FAIL", ENDED, True),
        ("DEADLINE", ENDED, True),
        ("SOMETHING_NEW", UNKNOWN, False),
        ("", UNKNOWN, False),
        (None, UNKNOWN, False),
    ],
)
def test_state_mapping(state, kind, final):
    assert classify_state(state) == kind
    assert state_is_final(state) == final


def test_state_descriptions_and_exit_codes():
    assert normalize_state("CANCELLED by 0") == "CANCELLED"
    assert describe_state("12", "PENDING", "Resources") == "Slurm job 12 PENDING (Resources)"
    assert describe_state("12", "CANCELLED", "None") == "Slurm job 12 CANCELLED"
    assert describe_state("12", "TIMEOUT", "TimeLimit") == "Slurm job 12 TIMEOUT"
    assert parse_exit_code("3:0") == 3
    assert parse_exit_code("0:9") == -9
    assert parse_exit_code("") is None and parse_exit_code("junk") is None
    log = (
        "srun: Job step aborted: Waiting up to 5 seconds for job step to finish.\n"
        "slurmstepd-node1: error: *** STEP 3.0 ON node1 CANCELLED AT 2026-12-02T14:16:46 ***\n"
        "slurmstepd-node1: error: *** JOB 3 ON node1 CANCELLED AT 2026-12-02T14:16:46 ***\n"
        "slurmstepd: error: *** JOB 4 ON n2 DUE TO TIME LIMIT AT 2026-12-02T14:16:46 ***\n"
    )
    assert ending_state_from_log(log, "3") == "CANCELLED"
    assert ending_state_from_log(log, "4") == "TIMEOUT"
    assert ending_state_from_log(log, "5") is None


def test_a_job_slurm_ended_is_named_whatever_its_workers_exit_code(tmp_path):
    """Which ending names a worker whose exit file is there: Slurm's, when Slurm ends the
    job (also while COMPLETING, from slurmstepd's line), never a job that ends because
    its tasks exited."""
    from corral.backends.slurm.job_files import sbatch_log_path
    from corral.backends.slurm.job_watch import slurm_ending
    from corral.backends.slurm.jobs import RoleJob
    from corral.backends.slurm.queue import JobState

    job = RoleJob("7", [0], str(tmp_path), "")
    with open(sbatch_log_path(str(tmp_path), "r"), "w") as fh:
        fh.write(
            "slurmstepd-node2: error: *** JOB 7 ON node2 CANCELLED AT 2026-12-04T02:56:34 ***\n"
        )
    completing = JobState("COMPLETING", completing=True)
    assert slurm_ending(job, "r", completing) == "Slurm job 7 CANCELLED"
    assert slurm_ending(job, "r", JobState("CANCELLED")) == "Slurm job 7 CANCELLED"
    assert slurm_ending(job, "r", JobState("TIMEOUT")) == "Slurm job 7 TIMEOUT"
    for by_its_tasks in ("RUNNING", "COMPLETED", "FAILED"):
        assert slurm_ending(job, "r", JobState(by_its_tasks)) is None
    assert slurm_ending(job, "other", completing) is None  # no stepd line: its tasks ended it
    assert slurm_ending(job, "r", None) is None


def _cfg(root: str, trial: str | None = None, gpus: int = 8) -> BaseExperimentConfig:
    cfg = BaseExperimentConfig(experiment_name="slurmtest", trial_name=trial or _trial())
    cfg.cluster.fileroot = root
    cfg.cluster.n_gpus_per_node = gpus
    return cfg


def _trial() -> str:
    return f"t{uuid.uuid4().hex[:8]}"


def test_dry_run_submits_nothing_and_prints_the_script(tmp_path, capsys):
    sched = SlurmScheduler(exp_config=_cfg(str(tmp_path), gpus=4), dry_run=True)
    job = Job(role="rollout", replicas=4, tasks=[SchedulingSpec(cpu=2, gpu=2, mem=4)])
    script = sched.render_script(job)
    assert sched.create_workers(job) == []
    assert capsys.readouterr().out.strip() == script.strip()
    assert "#SBATCH --nodes=2" in script and "#SBATCH --gres=gpu:4" in script
    assert "#SBATCH --job-name=slurmtest:" in script
    assert sched.roles == []
    sched.close()
    again = SlurmScheduler(exp_config=_cfg(str(tmp_path)), dry_run=True)
    text = again.render_script(Job(role="gen", replicas=2))
    again.close()
    assert "#SBATCH --ntasks=2" in text


def test_log_dir_that_cannot_be_created_is_a_config_error(tmp_path):
    (tmp_path / "logs").write_text("a file where the log directory should go")
    with pytest.raises(ConfigError, match="log directory"):
        SlurmScheduler(exp_config=_cfg(str(tmp_path), gpus=4), dry_run=True)


# ------------------------------------------------------- on the cluster --
@pytest.fixture(scope="module")
def lab():
    why = slurm_reachable()
    if why:
        require_service("slurm", why)
    if slurm_conf():
        os.environ.setdefault("SLURM_CONF", slurm_conf())
    return lab_gpus_per_node()


@pytest.fixture
def make(lab, tmp_path):
    made = []
    root = str(tmp_path / "root")

    def factory(**kwargs):
        cfg = _cfg(root)
        cfg.cluster.n_gpus_per_node = kwargs.pop("n_gpus_per_node", lab)  # the config wins
        kwargs.setdefault("startup_timeout", 60)
        sched = SlurmScheduler(exp_config=cfg, **kwargs)
        made.append(sched)
        return sched

    yield factory
    for sched in made:
        pids = [w.pid for role in sched.roles for w in sched.role_state(role).workers]
        sched.close()
        assert trial_jobs(sched.experiment_name, sched.trial_name) == []
        assert [p for p in pids if pid_alive(p)] == []


@pytest.mark.slurm
def test_role_over_two_nodes_gets_distinct_hosts_and_gpus_by_local_id(make, lab):
    if lab < 2:
        pytest.skip("needs lab nodes with >= 2 GPUs")
    per_task = lab // 2
    sched = make()
    ids = sched.create_workers(
        Job(role="wide", replicas=4, tasks=[SchedulingSpec(cpu=1, gpu=per_task)])
    )
    workers = sched.get_workers("wide")
    assert len({w.host for w in workers}) == 2
    job_id = sched.launcher_jobs["wide"]
    assert {w.backend_id for w in workers} == {job_id}
    by_host: dict[str, list[str]] = {}
    for wid, worker in zip(ids, workers, strict=True):
        asyncio.run(sched.create_engine(wid, ECHO, "e"))
        cvd = sched.call_engine(wid, "getenv", "e", "CUDA_VISIBLE_DEVICES")
        by_host.setdefault(worker.host, []).append(cvd)
    first = ",".join(str(i) for i in range(per_task))
    second = ",".join(str(i) for i in range(per_task, 2 * per_task))
    for host, values in by_host.items():
        assert sorted(values) == sorted([first, second]), (host, values)
    pids = [w.pid for w in workers]
    started = time.monotonic()
    sched.delete_workers()
    print(f"delete of 4 workers on 2 nodes: {time.monotonic() - started:.2f}s")
    assert squeue_state(job_id) in ("", "COMPLETED", "CANCELLED")
    deadline = time.monotonic() + 10
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [p for p in pids if pid_alive(p)] == []


@pytest.mark.slurm
def test_corral_stop_cancels_a_dead_controllers_jobs_through_the_registry(lab, tmp_path):
    """``corral stop`` asks the backend registry (corral.backends.stop_trial_leftovers):
    the Slurm entry cancels the trial's jobs (named experiment:trial:role), and only
    those."""
    from corral.backends import stop_trial_leftovers

    trial = f"stop{uuid.uuid4().hex[:6]}"

    def submit(name: str) -> str:
        out = subprocess.run(
            ["sbatch", "--parsable", "-J", name, "-o", "/dev/null", "--wrap", "sleep 300"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        return out.stdout.strip().split(";")[0]

    mine, other = submit(f"leftover:{trial}:role"), submit(f"leftover:{trial}x:role")
    try:
        assert stop_trial_leftovers("leftover", trial) == [f"cancelled Slurm job {mine}"]

        def state(job_id: str) -> str:
            return subprocess.run(
                ["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True
            ).stdout.split("JobState=")[-1].split()[0]  # fmt: skip

        deadline = time.monotonic() + 30  # a running job passes through COMPLETING
        while state(mine) != "CANCELLED" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert state(mine) == "CANCELLED"
        assert state(other) in ("PENDING", "RUNNING")
    finally:
        subprocess.run(["scancel", mine, other], capture_output=True)


@pytest.mark.slurm
def test_scancel_from_outside_gives_worker_failed_naming_cancelled(make):
    """Named CANCELLED whatever code the worker's own stop returned: that code differs
    between clusters (143 here, 1 where the process tracking also signals the batch
    script's subshell before it records the code), Slurm's state of the job does not."""
    sched = make()
    (wid,) = sched.create_workers(Job(role="victim", replicas=1))
    job_id = sched.launcher_jobs["victim"]
    subprocess.run(["scancel", job_id], check=True)
    deadline = time.monotonic() + 20
    error = None
    while time.monotonic() < deadline:
        try:
            sched.get_workers("victim")
        except WorkerFailedError as exc:
            error = exc
            break
        time.sleep(0.2)
    assert error is not None, "scancel from outside went unnoticed"
    assert error.worker_id == wid
    assert f"Slurm job {job_id} CANCELLED" in str(error), str(error)
    # the worker's exit file is there (it holds the code of its own stop): Slurm's
    # ending, not that code, still names why it went, whenever the backend looks
    exit_file = exit_code_path(str(sched.log_dir), "victim", 0, job_id)
    deadline = time.monotonic() + 20
    while not os.path.exists(exit_file) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert os.path.exists(exit_file), "the batch script wrote no exit file"
    (exit_,) = sched.launcher.poll("victim").values()
    assert exit_.reason == f"Slurm job {job_id} CANCELLED", exit_.reason
    # once Slurm has taken the job away, the reason is Slurm's state
    deadline = time.monotonic() + 20
    while not squeue_state(job_id).startswith("CANCELLED") and time.monotonic() < deadline:
        time.sleep(0.2)
    for exit_ in sched.launcher.poll("victim").values():
        assert exit_.log_path and exit_.reason == f"Slurm job {job_id} CANCELLED"
    assert error.log_path


@pytest.mark.slurm
def test_exit_files_left_under_reused_job_ids_do_not_fail_a_new_role(make):
    """Slurm reuses job ids (a cold-started controller counts from FirstJobId again), so
    an earlier run of the same trial may have left ``<index>.<id>.exit`` under the id the
    new job gets; that file must not make the new replica look dead before it starts."""
    sched = make()
    probe = subprocess.run(
        ["sbatch", "--parsable", "--hold", "-J", "corral-test-probe", "-o", "/dev/null",
         "--wrap", "true"],
        capture_output=True, text=True, check=True,
    ).stdout.strip().split(";")[0]  # fmt: skip
    subprocess.run(["scancel", probe], check=True)
    role_dir = sched.log_dir / "reused"
    role_dir.mkdir(parents=True)
    for job_id in range(int(probe) + 1, int(probe) + 40):  # the ids the next jobs get
        (role_dir / f"0.{job_id}.exit").write_text("0\n")
    (role_dir / "0.exit").write_text("0\n")
    (wid,) = sched.create_workers(Job(role="reused", replicas=1))
    assert int(sched.launcher_jobs["reused"]) in range(int(probe) + 1, int(probe) + 40)
    asyncio.run(sched.create_engine(wid, ECHO, "e"))
    assert sched.call_engine(wid, "echo", "e", 7) == 7
    assert sched.get_workers("reused")[0].id == wid


@pytest.mark.slurm
def test_request_beyond_free_gpus_pends_and_times_out_with_slurm_reason(make, lab, tmp_path):
    if lab < 1:
        pytest.skip("needs lab nodes with GPUs")
    nodes = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True)
    n_nodes = len(set(nodes.stdout.split()))
    hog = subprocess.run(
        ["sbatch", "--parsable", f"-N{n_nodes}", f"--gres=gpu:{lab}", "-J", "corral-test-hog",
         "-o", str(tmp_path / "hog.out"), "--wrap", "sleep 300"],
        capture_output=True, text=True, check=True,
    ).stdout.strip().split(";")[0]  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while squeue_state(hog) != "RUNNING" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert squeue_state(hog) == "RUNNING"
        sched = make(startup_timeout=4)
        with pytest.raises(WorkerTimeoutError, match=r"PENDING \(Resources\)"):
            sched.create_workers(Job(role="starved", replicas=1, tasks=[SchedulingSpec(gpu=1)]))
        assert sched.roles == []
        assert trial_jobs(sched.experiment_name, sched.trial_name) == []
    finally:
        subprocess.run(["scancel", hog])


@pytest.mark.slurm
def test_request_slurm_refuses_gives_worker_creation_error(make, lab):
    too_many = lab + 4
    sched = make(n_gpus_per_node=too_many)
    sched.launcher.cluster.inventory = {}  # skip corral's own sinfo check: sbatch itself refuses
    with pytest.raises(WorkerCreationError) as info:
        sched.create_workers(Job(role="huge", replicas=1, tasks=[SchedulingSpec(gpu=too_many)]))
    text = str(info.value)
    assert "Requested node configuration is not available" in text
    assert f"gpu={too_many}" in text
    assert sched.roles == []


def _cancel_trial_jobs(experiment: str, trial: str) -> list[str]:
    left = trial_jobs(experiment, trial)
    for line in left:
        subprocess.run(["scancel", line.split()[0]])
    deadline = time.monotonic() + 30
    while trial_jobs(experiment, trial) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def _lab_node_size() -> tuple[int, int]:
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%c %m"], capture_output=True, text=True)
    cpus, mem = out.stdout.split("\n")[0].split()
    return int(cpus), int(mem)


@pytest.mark.slurm
@pytest.mark.timeout(240)
def test_spec_colocation_example_runs(lab):
    cpus, mem_mb = _lab_node_size()
    assert cpus >= 16 and mem_mb >= 64 * 1024, (
        f"the spec's example asks 2 x (cpu=8, mem=32G) on one node but lab nodes have "
        f"{cpus} CPUs and {mem_mb} MB: start the lab with CORRAL_SLURM_CPUS=16 "
        "CORRAL_SLURM_MEM_MB=131072"
    )
    _cancel_trial_jobs("demo", "run1")
    try:
        r = subprocess.run(
            [sys.executable, str(ROOT / "examples" / "slurm_colocation.py")],
            capture_output=True, text=True, timeout=180, cwd=str(ROOT),
        )  # fmt: skip
        assert r.returncode == 0, r.stdout + r.stderr
        assert "Rollout IDs: ['rollout/0', 'rollout/1']" in r.stdout
        assert "Proxy IDs: ['proxy/0', 'proxy/1']" in r.stdout
        assert "failed" not in r.stderr, r.stderr
    finally:
        # the example never deletes its workers: its exit does (atexit), or we do
        left = _cancel_trial_jobs("demo", "run1")
    assert left == [], f"the example left jobs behind: {left}"


def _trial_job_names(experiment: str, trial: str) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%j"], capture_output=True, text=True).stdout
    return [j for j in out.split() if j.startswith(f"{experiment}:{trial}:")]


@pytest.mark.slurm
@pytest.mark.timeout(180)
def test_restart_policy_restarts_one_replica_inside_its_job_on_its_node_and_gpus(make, lab):
    if lab < 2:
        pytest.skip("needs lab nodes with 2 GPUs")
    sched = make()
    made = []

    def hook(s, worker_id):
        asyncio.run(s.create_engine(worker_id, ECHO, "e", tag="again"))
        made.append(worker_id)

    sched.set_restart_hook("phoenix", hook)
    ids = sched.create_workers(
        Job(role="phoenix", replicas=2, tasks=[SchedulingSpec(cpu=1, gpu=1, max_restarts=1)])
    )
    for wid in ids:
        asyncio.run(sched.create_engine(wid, ECHO, "e"))
    first_job = sched.launcher_jobs["phoenix"]
    keeper, victim = sched.get_workers("phoenix")
    assert keeper.backend_id == victim.backend_id == first_job
    victim_gpus = sched.call_engine(ids[1], "getenv", "e", "CUDA_VISIBLE_DEVICES")
    assert victim_gpus and victim_gpus != sched.call_engine(
        ids[0], "getenv", "e", "CUDA_VISIBLE_DEVICES"
    )

    os.kill(victim.pid, signal.SIGKILL)
    with pytest.raises(WorkerFailedError) as info:
        sched.call_engine(ids[1], "noop", "e")
    assert info.value.restarted and "restarted it (1 of 1)" in str(info.value)
    assert made == [ids[1]]

    kept, again = sched.get_workers("phoenix")
    # replica 0 was never touched: same process, still answering
    assert kept.pid == keeper.pid and kept.generation == keeper.generation
    assert pid_alive(keeper.pid)
    assert sched.call_engine(ids[0], "pid", "e") == keeper.pid
    # replica 1 is a new process, a new step of the SAME job, on the same node and GPUs
    assert again.pid != victim.pid and again.generation != victim.generation
    assert again.index == 1 and sched.call_engine(ids[1], "echo", "e", 5) == 5
    assert sched.launcher.job_ids("phoenix") == [first_job]
    assert again.backend_id == first_job
    assert again.host == victim.host
    assert sched.call_engine(ids[1], "getenv", "e", "CUDA_VISIBLE_DEVICES") == victim_gpus
    assert sched.launcher.poll("phoenix") == {}
    assert squeue_state(first_job) == "RUNNING"
    assert len(_trial_job_names(sched.experiment_name, sched.trial_name)) == 1

    # the budget is spent: the second death is final
    os.kill(again.pid, signal.SIGKILL)
    with pytest.raises(WorkerFailedError) as info:
        sched.call_engine(ids[1], "noop", "e")
    assert not info.value.restarted
    assert made == [ids[1]]
    assert sched.call_engine(ids[0], "pid", "e") == keeper.pid
    assert sched.call_engine(ids[0], "echo", "e", 7) == 7

    pids = [keeper.pid, victim.pid, again.pid]
    sched.delete_workers()
    assert _trial_job_names(sched.experiment_name, sched.trial_name) == []
    deadline = time.monotonic() + 10
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [p for p in pids if pid_alive(p)] == []
