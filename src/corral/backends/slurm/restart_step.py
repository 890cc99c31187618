"""Slurm: restart a dead replica as a new step inside its job, on its node and GPUs.

A role with ``max_restarts > 0`` keeps its allocation while the controller lives (its
batch script ends with ``python -m corral.worker.hold``), and each task records where it
runs in ``<log_dir>/<role>/<index>.place`` (node, devices). A restart is then

    srun --jobid=<job> --overlap --nodes=1 --ntasks=1 --nodelist=<node> ... bash -c <task>

with ``CORRAL_DEVICES`` pinning the dead replica's GPUs. The step does not ask for
``--gres``: Slurm would hand out the node's *first* GPUs of the job (possibly a live
replica's); without it the step sees the job's GPUs on that node and the task script
picks the recorded ones. No new job is queued, so a full cluster cannot keep it pending.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

from corral.backends.slurm.job_files import JobFiles
from corral.procs import spawn


@dataclass
class Place:
    node: str
    devices: str


def place_path(log_dir: str, role: str, index: int) -> str:
    return JobFiles(log_dir).place_file(role, index)


def read_place(log_dir: str, role: str, index: int) -> Place | None:
    try:
        with open(place_path(log_dir, role, index)) as fh:
            words = fh.read().split()
    except OSError:
        return None
    if not words:
        return None
    return Place(words[0], words[1] if len(words) > 1 else "")


def start_step(
    job_id: str,
    place: Place,
    cpus: int,
    index: int,
    env: dict[str, str],
    task_script: str,
) -> subprocess.Popen:
    """``srun --overlap`` one task of the worker into ``job_id`` on ``place.node``."""
    step_env = dict(env)
    step_env["CORRAL_INDEX_OFFSET"] = str(index)
    step_env["CORRAL_DEVICES"] = place.devices
    step_env["CORRAL_BACKEND_ID"] = job_id
    argv = [
        "srun",
        f"--jobid={job_id}",
        "--overlap",
        "--nodes=1",
        "--ntasks=1",
        f"--nodelist={place.node}",
        f"--cpus-per-task={max(1, cpus)}",
        "--kill-on-bad-exit=1",
        "--unbuffered",
        "bash",
        "-c",
        task_script,
    ]
    return spawn(argv, step_env)


def step_failure(proc: subprocess.Popen) -> str | None:
    """Why a restart step ended without its worker writing an exit code, if it has ended."""
    code = proc.poll()
    if code is None:
        return None
    out = b""
    if proc.stdout is not None:
        try:
            out = proc.stdout.read() or b""
        except (OSError, ValueError):
            out = b""
    text = out.decode(errors="replace").strip().splitlines()
    detail = "; ".join(text[-3:]) if text else f"exit code {code}"
    return f"the restart step (srun --overlap) ended: {detail}"
