"""The files of a role's Slurm jobs in the trial's log directory, and what they say.

Written by the launcher: the batch script of a role (``<role>.sbatch``), of a grown
part (``<role>.grow<first>.sbatch``) and of a restarted replica. Written by Slurm and the
task script (corral.backends.slurm.batch_script): the batch log (``<role>.sbatch.log``,
where slurmstepd says a job was cancelled or requeued), each replica's exit file and, for
a role that may restart its workers, the place (node, GPUs) each replica runs on.
The worker logs every backend shares are :class:`corral.paths.TrialPaths`'.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class JobFiles:
    """The Slurm files of one trial, named from its log directory (the controller's and
    a rendered script's view alike)."""

    log_dir: str

    def batch_script(self, role: str) -> str:
        return os.path.join(self.log_dir, f"{role}.sbatch")

    def grow_script(self, role: str, first: int) -> str:
        """The script of replicas ``first``.. added to a running role."""
        return os.path.join(self.log_dir, f"{role}.grow{first}.sbatch")

    def restart_script(self, role: str, index: int, n: int) -> str:
        return os.path.join(self.log_dir, f"{role}.{index}.restart{n}.sbatch")

    def batch_log(self, role: str) -> str:
        """Slurm's own output of the role's batch script (srun errors, bash errors)."""
        return os.path.join(self.log_dir, f"{role}.sbatch.log")

    def exit_file(self, role: str, index: int, job_id: str | None = None) -> str:
        """Written by a task when its worker exits on its own: the exit code.

        Absent while the worker runs, and when the task itself was killed (scancel,
        ``--kill-on-bad-exit``). Named after the Slurm job (``<index>.<job>.exit``), so
        that a job of an earlier run of the same trial, still ending, never writes the
        file a new run reads.
        """
        name = f"{index}.{job_id}.exit" if job_id else f"{index}.exit"
        return os.path.join(self.log_dir, role, name)

    def place_file(self, role: str, index: int) -> str:
        """Written by the task of a restartable replica: the node and devices it runs on."""
        return os.path.join(self.log_dir, role, f"{index}.place")


def sbatch_log_path(log_dir: str, role: str) -> str:
    return JobFiles(log_dir).batch_log(role)


def exit_code_path(log_dir: str, role: str, index: int, job_id: str | None = None) -> str:
    return JobFiles(log_dir).exit_file(role, index, job_id)


def replica_exit_files(log_dir: str, role: str, index: int) -> list[str]:
    """Every exit file replica ``index`` of ``role`` has: ``<index>.exit`` and
    ``<index>.<job>.exit`` of any job."""
    role_dir = os.path.dirname(exit_code_path(log_dir, role, index))
    pattern = re.compile(rf"{index}(\.\d+)?\.exit")
    try:
        names = os.listdir(role_dir)
    except FileNotFoundError:
        return []
    return [os.path.join(role_dir, n) for n in names if pattern.fullmatch(n)]


def forget_exits(log_dir: str, role: str, index: int, job_id: str | None = None) -> None:
    """Remove the exit file of replica ``index`` in job ``job_id``; without a job id,
    every exit file the replica has (of any job), before a new job is submitted.

    Slurm reuses job ids (a controller cold start begins again at FirstJobId, ids wrap
    at MaxJobId), so a file an earlier run of the same trial left under the id the new
    job gets would make the new replica look dead before it starts."""
    paths = (
        [exit_code_path(log_dir, role, index, job_id)]
        if job_id
        else replica_exit_files(log_dir, role, index)
    )
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def read_exit_file(path: str) -> int | None:
    """The exit code a task wrote, or None while there is none."""
    try:
        with open(path) as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return None


def describe_exit_code(code: int) -> str:
    if code > 128:
        import signal

        try:
            return f"killed by {signal.Signals(code - 128).name} (exit status {code})"
        except ValueError:
            pass
    return f"exited with code {code}"


# ------------------------------------------------------- the batch log's words --
_STEPD_END_RE = re.compile(r"\*\*\* JOB (\d+) ON \S+ (CANCELLED|DUE TO [A-Z ]+?) AT ")
_STEPD_REASONS = {
    "CANCELLED": "CANCELLED",
    "DUE TO TIME LIMIT": "TIMEOUT",
    "DUE TO NODE FAILURE": "NODE_FAIL",
    "DUE TO PREEMPTION": "PREEMPTED",
    "DUE TO JOB REQUEUE": "REQUEUED",
}


def requeue_count(log_path: str, job_id: str) -> int:
    """How many times slurmstepd wrote that job ``job_id`` was requeued or preempted."""
    try:
        with open(log_path, errors="replace") as fh:
            text = fh.read()
    except OSError:
        return 0
    return len(
        re.findall(
            rf"\*\*\* JOB {re.escape(job_id)} ON \S+ CANCELLED AT \S+ DUE TO "
            r"(?:JOB REQUEUE|PREEMPTION)",
            text,
        )
    )


def ending_state_from_log(text: str, job_id: str) -> str | None:
    """Why a job that is still COMPLETING ends, from slurmstepd's ``*** JOB <id> ON <node>
    CANCELLED AT ...`` line in the batch log (Slurm itself says only COMPLETING)."""
    for m in _STEPD_END_RE.finditer(text):
        if m.group(1) == job_id:
            return _STEPD_REASONS.get(m.group(2), m.group(2))
    return None
