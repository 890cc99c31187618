"""The Slurm backend under test: the single-machine lab cluster of .ci/slurm_cluster.sh."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess

import pytest

from tests.conformance.harness import BackendUnderTest, require_service

LAB = os.environ.get("CORRAL_SLURM_DIR", "/tmp/corral-slurm")


def slurm_conf() -> str | None:
    """SLURM_CONF of the lab, if the caller did not set one and the lab wrote one."""
    conf = os.environ.get("SLURM_CONF") or os.path.join(LAB, "etc", "slurm.conf")
    return conf if os.path.exists(conf) else None


def slurm_reachable() -> str | None:
    """None if ``scontrol ping`` answers UP, else why not."""
    if not shutil.which("scontrol"):
        return "scontrol not found (bash .ci/slurm_cluster.sh up)"
    env = dict(os.environ)
    if slurm_conf():
        env.setdefault("SLURM_CONF", slurm_conf())
    try:
        r = subprocess.run(
            ["scontrol", "ping"], capture_output=True, text=True, timeout=10, env=env
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"scontrol ping failed: {exc}"
    if "is UP" not in r.stdout:
        return (
            f"slurmctld is not up ({(r.stdout + r.stderr).strip()}); bash .ci/slurm_cluster.sh up"
        )
    return None


def lab_gpus_per_node() -> int:
    """GPUs of one lab node (gres/gpu), from the lab's env file or sinfo."""
    value = os.environ.get("CORRAL_SLURM_GPUS_PER_NODE")
    if value:
        return int(value)
    out = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%G"], capture_output=True, text=True
    ).stdout.split()
    counts = [int(g.split(":")[-1].split("(")[0]) for g in out if g.startswith("gpu:")]
    return min(counts) if counts else 0


def lab_nodes() -> int:
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True)
    return len(set(out.stdout.split()))


def trial_jobs(experiment: str, trial: str) -> list[str]:
    """Jobs of the trial still in squeue (pending, running or completing)."""
    out = subprocess.run(["squeue", "-h", "-o", "%i %j %T"], capture_output=True, text=True).stdout
    prefix = f"{experiment}:{trial}:"
    return [
        line
        for line in out.splitlines()
        if line.split()[1:2] and line.split()[1].startswith(prefix)
    ]


def squeue_state(job_id: str) -> str:
    return subprocess.run(
        ["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T"], capture_output=True, text=True
    ).stdout.strip()


class SlurmRequeue:
    """``scontrol requeue``: what a preemption with PreemptMode=REQUEUE does. Slurm signals
    the job's steps (SIGTERM), ends them and queues the same job again."""

    heard = "SIGTERM"

    def __init__(self) -> None:
        self.job_ids: dict[str, str] = {}

    def job(self, role: str, replicas: int, **spec):
        from corral import Job, SchedulingSpec

        return Job(role=role, replicas=replicas, tasks=[SchedulingSpec(cpu=1, **spec)])

    def warn(self, sched, role: str) -> None:
        job = self.job_ids[role] = sched.launcher_jobs[role]
        with open(os.path.join(sched.log_dir, f"{role}.sbatch")) as fh:
            assert "--requeue" in fh.read()
        subprocess.run(["scontrol", "requeue", job], check=True)

    def take(self, sched, role: str) -> None:
        """Slurm ends the steps itself after the signal."""

    def give_back(self, sched, role: str) -> None:
        """Slurm holds a requeued job for ~2 minutes (its BeginTime): release it now."""
        import time

        job = self.job_ids[role]
        deadline = time.monotonic() + 60
        while squeue_state(job) != "PENDING":
            assert time.monotonic() < deadline, f"job {job} never pended again"
            time.sleep(0.1)
        subprocess.run(["scontrol", "update", f"jobid={job}", "StartTime=now"], check=True)

    def check_back(self, sched, role: str) -> None:
        job = self.job_ids[role]
        assert sched.launcher_jobs[role] == job  # the same job, requeued, not a new one
        jobs = trial_jobs(sched.experiment_name, sched.trial_name)
        assert [line.split()[0] for line in jobs] == [job], jobs  # no restart job beside it


@pytest.fixture(scope="session")
def slurm_backend(tmp_path_factory) -> BackendUnderTest:
    why = slurm_reachable()
    if why:
        require_service("slurm", why)
    if slurm_conf():
        os.environ.setdefault("SLURM_CONF", slurm_conf())
    from corral.backends.slurm.scheduler import SlurmScheduler

    # one machine: every "node" sees /tmp
    root = str(tmp_path_factory.mktemp("corral-slurm"))
    os.chmod(root, 0o755)

    def make(cfg, **kwargs):
        kwargs.setdefault("startup_timeout", 60)
        return SlurmScheduler(exp_config=cfg, fileroot=root, **kwargs)

    env = {"SLURM_CONF": slurm_conf()} if slurm_conf() else {}
    return BackendUnderTest(
        name="slurm",
        make=make,
        gpus_per_node=lab_gpus_per_node(),
        nodes=lab_nodes(),
        fileroot=root,
        controller_env=env,
        leftovers=trial_jobs,
        preemption=lambda: contextlib.nullcontext(SlurmRequeue()),
    )
