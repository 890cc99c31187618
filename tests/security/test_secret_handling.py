"""Attacks 5, 6 and 8 and the `corral stop` scope: dry runs wrote a new secret over a
running trial's; secrets were never deleted; sbatch files (with env_vars such as tokens)
and logs were readable by other users; on Ray the secret sat in the actor's environment
and runtime_env; a Slurm admin's `corral stop` could cancel other users' jobs."""

from __future__ import annotations

import asyncio
import glob
import os
import stat
import subprocess
import time

import pytest

from corral import BaseExperimentConfig, Job, SchedulingSpec
from corral.errors import TrialInUseError
from tests.conftest import BACKENDS
from tests.security.support import MALLORY, as_mallory, environ_of, mallory

ECHO = "corral.testing.engines.EchoEngine"


def _mode(path: str) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _files_under(root: str) -> dict[str, int]:
    found = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            found[path] = os.stat(path).st_size
    return found


def test_no_secret_in_any_worker_environment_or_launch_record(sched) -> None:
    (wid,) = sched.create_workers(
        Job(role="env", replicas=1, tasks=[SchedulingSpec(cpu=1, env_vars={"HF_TOKEN": "t0k"})])
    )
    (child,) = sched.fork_workers("envchild", "env")
    secret = sched.secret.encode()
    for worker in (sched.get_workers("env")[0], sched.get_workers("envchild")[0]):
        # what the process was started with: on Ray that is the Ray worker's own
        # environment (corral sets its variables inside the actor), elsewhere corral's
        environ = environ_of(worker.pid)
        assert (b"RAY_" if sched.backend == "ray" else b"CORRAL_") in environ  # the right process
        assert secret not in environ, worker.id
        assert b"CORRAL_SECRET=" not in environ
        asyncio.run(sched.create_engine(worker.id, ECHO, "env"))
        inside = sched.call_engine(worker.id, "environ", "env")
        assert inside.get("CORRAL_ROLE") == worker.id.split("/")[0]  # the variables are there
        assert "CORRAL_SECRET" not in inside
        assert not [k for k, v in inside.items() if sched.secret in v], worker.id
    if sched.backend == "ray":
        for record in sched.launcher.state.roles["env"].replicas:
            assert sched.secret not in repr(record.env)  # what went into runtime_env
    if sched.backend == "slurm":
        (script,) = glob.glob(os.path.join(sched.log_dir, "env.sbatch"))
        with open(script) as fh:
            assert sched.secret not in fh.read()
    assert sched.health(child)["status"] == "ok"


def test_logs_and_scripts_are_private_to_the_user(sched) -> None:
    sched.create_workers(
        Job(role="logs", replicas=1, tasks=[SchedulingSpec(cpu=1, env_vars={"HF_TOKEN": "t0k"})])
    )
    replica_log = os.path.join(sched.log_dir, "logs", "0.log")
    for _ in range(400):  # the worker prints its start line into its log
        if os.path.exists(replica_log):
            break
        time.sleep(0.05)
    files = [p for p in _files_under(sched.log_dir) if "/logs" in p or p.endswith(".sbatch")]
    assert replica_log in files, files
    for path in files:
        assert _mode(path) == 0o600, path
    directory = sched.log_dir
    while directory != sched.fileroot:
        assert _mode(directory) == 0o700, directory
        directory = os.path.dirname(directory)
    for path in files:
        read = as_mallory(["cat", path])
        assert read.returncode != 0 and "Permission denied" in read.stderr, path


def test_secret_file_is_per_run_exclusive_and_removed_at_close(backend, sched) -> None:
    sched.create_workers(Job(role="first", replicas=1))
    path = sched.secret_file
    assert _mode(path) == 0o600 and _mode(os.path.dirname(path)) == 0o700
    with open(path) as fh:
        assert fh.read() == sched.secret
    cfg = BaseExperimentConfig(experiment_name=sched.experiment_name, trial_name=sched.trial_name)
    cfg.cluster.n_gpus_per_node = backend.gpus_per_node
    second = backend.make(cfg)  # a second controller run of the same trial
    try:
        assert not os.path.exists(path) or second.secret != sched.secret
        with pytest.raises(TrialInUseError):
            second.create_workers(Job(role="second", replicas=1))
        with open(path) as fh:
            assert fh.read() == sched.secret  # the running trial's secret is untouched
    finally:
        second.close()
    assert os.path.exists(path)  # closing the refused run did not remove it
    (child,) = sched.fork_workers("firstchild", "first")  # the running trial still works
    assert sched.health(child)["status"] == "ok"
    sched.close()
    assert not os.path.exists(path)


@pytest.fixture
def slurm_only(request):
    if "slurm" not in BACKENDS:
        pytest.skip("Slurm-only attack; CORRAL_TEST_BACKENDS does not include slurm")
    return request.getfixturevalue("slurm_backend")


def test_dry_run_writes_nothing_and_keeps_the_running_trials_secret(slurm_only) -> None:
    from corral.backends.slurm.scheduler import SlurmScheduler

    sched = slurm_only.scheduler()
    try:
        sched.create_workers(Job(role="live", replicas=1))
        before = _files_under(sched.fileroot)
        cfg = BaseExperimentConfig(
            experiment_name=sched.experiment_name, trial_name=sched.trial_name
        )
        cfg.cluster.fileroot = sched.fileroot
        cfg.cluster.n_gpus_per_node = slurm_only.gpus_per_node
        dry = SlurmScheduler(exp_config=cfg, dry_run=True)
        try:
            script = dry.render_script(Job(role="live2", replicas=2))
        finally:
            dry.close()
        assert "#SBATCH" in script and sched.secret not in script
        after = _files_under(sched.fileroot)
        new = set(after) - set(before)
        assert not [p for p in new if not p.endswith(".log")], new  # logs of the live worker
        (child,) = sched.fork_workers("livechild", "live")
        assert sched.health(child)["status"] == "ok"
    finally:
        sched.close()


def test_corral_stop_leaves_other_users_jobs_alone(slurm_only) -> None:
    from corral.backends.slurm.leftover_jobs import cancel_trial_jobs

    mallory()
    submitted = as_mallory(
        ["sbatch", "--parsable", "-J", "sec:stopscope:role", "-o", "/dev/null",
         "--wrap", "sleep 300"],
        env={**os.environ},
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().split(";")[0]
    try:
        assert job_id not in cancel_trial_jobs("sec", "stopscope")
        queue = subprocess.run(
            ["squeue", "-h", "-j", job_id, "-o", "%u %T"], capture_output=True, text=True
        )
        assert queue.stdout.split()[:1] == [MALLORY], queue
    finally:
        subprocess.run(["scancel", job_id], capture_output=True)
