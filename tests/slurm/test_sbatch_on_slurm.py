"""The rendered sbatch script run as a real job on the lab cluster (.ci/slurm_cluster.sh):
placement, environment and logs of every task, and a failing task failing the job.
The rendering itself is unit-tested without Slurm in tests/unit/test_sbatch.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from corral.backends.slurm.batch_script import render_sbatch_script
from corral.backends.slurm.job_files import exit_code_path, sbatch_log_path
from corral.paths import merged_log_path, replica_log_path, role_log_path
from corral.spec import SchedulingSpec
from tests.slurm.test_slurm_backend import lab  # noqa: F401  (fixture: the lab is up)
from tests.unit.test_sbatch import make_params, read_lines


def _submit(script: Path) -> str:
    out = subprocess.run(
        ["sbatch", "--parsable", str(script)], capture_output=True, text=True, check=True
    ).stdout
    return out.strip().split(";")[0]


def _wait_job(job_id: str, timeout: float = 90) -> str:
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        r = subprocess.run(
            ["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T"],
            capture_output=True,
            text=True,
        )
        state = r.stdout.strip()
        if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
            return state
        time.sleep(0.2)
    subprocess.run(["scancel", job_id])
    pytest.fail(f"job {job_id} did not finish in {timeout}s (last state {state!r})")


def _job_field(job_id: str, name: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout
    m = re.search(rf"\b{name}=(\S+)", out)
    return m.group(1) if m else ""


@pytest.mark.slurm
@pytest.mark.timeout(180)
def test_rendered_script_on_slurm(lab, tmp_path):  # noqa: F811
    """4 replicas x 1 GPU on 2-GPU nodes: 2 nodes, distinct hostnames, GPUs by LOCALID."""
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    cmd = (
        f"{sys.executable} -c 'import json, os, socket; e = os.environ; "
        'print(json.dumps(dict(host=socket.gethostname(), procid=e["SLURM_PROCID"], '
        'localid=e["SLURM_LOCALID"], cvd=e["CUDA_VISIBLE_DEVICES"], role=e["CORRAL_ROLE"], '
        'nr=json.loads(e["CORRAL_NAME_RESOLVE"]), backend=e["CORRAL_BACKEND_ID"])))\''
    )
    params = make_params(
        job_name="corral_sbatch_test",
        role="rollout",
        replicas=4,
        spec=SchedulingSpec(cpu=1, gpu=1, mem=1, cmd=cmd),
        n_gpus_per_node=2,
        log_dir=str(log_dir),
        name_resolve={"type": "files", "root": str(tmp_path / "nr")},
    )
    script = tmp_path / "job.sh"
    script.write_text(render_sbatch_script(params))
    job_id = _submit(script)
    state = _wait_job(job_id)
    sbatch_log = Path(sbatch_log_path(str(log_dir), "rollout"))
    detail = sbatch_log.read_text() if sbatch_log.exists() else "(no sbatch log)"
    assert state == "COMPLETED", detail

    hosts = set()
    for index in range(4):
        (line,) = read_lines(replica_log_path(str(log_dir), "rollout", index))
        fields = json.loads(line)
        assert fields["procid"] == str(index)
        assert fields["cvd"] == fields["localid"]  # gres gpu:2 per node -> 0,1 by LOCALID
        assert fields["role"] == "rollout"
        assert fields["backend"] == job_id
        assert fields["nr"] == {"type": "files", "root": str(tmp_path / "nr")}
        hosts.add(fields["host"])
    assert len(hosts) == 2, hosts
    merged = read_lines(merged_log_path(str(log_dir)))
    assert sorted(line.split("]")[0] for line in merged) == [f"[rollout/{i}" for i in range(4)]
    assert len(read_lines(role_log_path(str(log_dir), "rollout"))) == 4


@pytest.mark.slurm
@pytest.mark.timeout(180)
def test_failing_worker_fails_the_job(lab, tmp_path):  # noqa: F811
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    cmd = (
        f"{sys.executable} -c 'import os, sys, time; "
        'print("worker", os.environ["SLURM_PROCID"]); '
        'sys.exit(3) if os.environ["SLURM_PROCID"] == "1" else time.sleep(60)\''
    )
    params = make_params(
        job_name="corral_sbatch_fail",
        role="bad",
        replicas=2,
        spec=SchedulingSpec(cpu=1, gpu=0, mem=1, cmd=cmd),
        log_dir=str(log_dir),
    )
    script = tmp_path / "job.sh"
    script.write_text(render_sbatch_script(params))
    job_id = _submit(script)
    state = _wait_job(job_id)
    # --kill-on-bad-exit: the sleeping replica is killed, not waited for
    assert state == "FAILED"
    # srun reports the highest task exit code (143 for the replica it killed), so the
    # failing replica's own code comes from its exit file
    assert _job_field(job_id, "ExitCode") != "0:0"
    assert Path(exit_code_path(str(log_dir), "bad", 1, job_id)).read_text() == "3\n"
    assert read_lines(replica_log_path(str(log_dir), "bad", 1)) == ["worker 1"]
