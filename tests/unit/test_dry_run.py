"""Dry runs on every backend: ``corral run --dry-run`` and ``Scheduler.dry_run(job)``
print the launch request and create nothing (no fileroot, secret, logs or name-resolve
directory; Ray is not even imported). Slurm and Ray need no cluster for this."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from corral.backends.local import LocalScheduler
from corral.config import BaseExperimentConfig
from corral.errors import ConfigError
from corral.spec import Job, SchedulingSpec

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src")

EXPECTED = {
    "local": ["# dry run (local): 2 gen worker", "-m corral.worker", "CORRAL_ROLE=gen"],
    "ray": ["placement_group([{'CPU': 1.0}]", "RayWorkerActor.options(", "CORRAL_INDEX=1"],
    "slurm": ["#SBATCH --ntasks=2", "#SBATCH --job-name=dr:t1:gen", "srun "],
}


def _cli(tmp_path, backend: str, fileroot: str) -> tuple[int, str, dict]:
    config = tmp_path / "c.yaml"
    config.write_text(
        textwrap.dedent(f"""\
            experiment_name: dr
            trial_name: t1
            cluster:
              fileroot: {fileroot}
              n_gpus_per_node: 4
            """)
    )
    probe = (
        "import json, sys\n"
        "from corral.cli import main\n"
        "rc = main(sys.argv[1:])\n"
        "print('@@' + json.dumps({'rc': rc, 'ray': 'ray' in sys.modules}))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.path.abspath(SRC)}
    args = [str(config), f"scheduler.type={backend}", "--role", "gen", "--replicas", "2"]
    proc = subprocess.run(
        [sys.executable, "-c", probe, "run", *args, "--dry-run"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out, _, tail = proc.stdout.rpartition("@@")
    return json.loads(tail)["rc"], out, json.loads(tail)


def test_dry_run_scheduler_prints_instead_of_starting(tmp_path, capsys):
    cfg = BaseExperimentConfig(experiment_name="dr", trial_name="t2")
    root = tmp_path / "root"
    sched = LocalScheduler(exp_config=cfg, fileroot=str(root), gpu_devices=[0, 1], dry_run=True)
    try:
        job = Job(role="gen", replicas=2, tasks=[SchedulingSpec(gpu=1)])
        text = sched.dry_run(job)
        assert "## gen/0: GPUs [0]" in text and "## gen/1: GPUs [1]" in text
        assert sched.create_workers(job) == []
        assert capsys.readouterr().out.strip() == text.strip()
        assert sched.roles == []
    finally:
        sched.close()
    assert not root.exists()


def test_dry_run_refuses_what_the_real_run_would(tmp_path):
    cfg = BaseExperimentConfig(experiment_name="dr", trial_name="t3")
    sched = LocalScheduler(exp_config=cfg, fileroot=str(tmp_path), gpu_devices=[0], dry_run=True)
    try:
        with pytest.raises(ConfigError, match="gpu"):
            sched.dry_run(Job(role="gen", replicas=2, tasks=[SchedulingSpec(gpu=1)]))
    finally:
        sched.close()


def test_dry_run_fileroot_that_cannot_be_created_is_a_config_error(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    cfg = BaseExperimentConfig(experiment_name="dr", trial_name="t4")
    with pytest.raises(ConfigError, match="cluster.fileroot"):
        LocalScheduler(exp_config=cfg, fileroot=str(tmp_path / "file" / "root"), dry_run=True)
