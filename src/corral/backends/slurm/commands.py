"""Running Slurm's client commands (``sbatch``, ``squeue``, ``scontrol``, ``scancel``,
``sinfo``): found on PATH or refused with the fix, bounded by a timeout, and told apart
when slurmctld does not answer (an outage) from when it refuses."""

from __future__ import annotations

import shutil
import subprocess

from corral.errors import SchedulerError

STOP_TIMEOUT_SECONDS = 60.0
COMMAND_TIMEOUT_SECONDS = 60.0
GRACEFUL_STOP_SECONDS = 5.0
QUERY_TIMEOUT_SECONDS = 3.0


def require_command(command: str) -> str:
    """The path of a Slurm command, or SchedulerError saying how to get it."""
    path = shutil.which(command)
    if path is None:
        raise SchedulerError(
            f"{command} not found: is this a Slurm login node? Install the Slurm client "
            "commands or put them on PATH."
        )
    return path


def run_command(
    argv: list[str], timeout: float = COMMAND_TIMEOUT_SECONDS, umask: int = -1
) -> subprocess.CompletedProcess:
    """Run a Slurm command, output captured; SchedulerError when it does not answer."""
    require_command(argv[0])
    try:
        return subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            umask=umask,
        )
    except subprocess.TimeoutExpired:
        raise SchedulerError(
            f"{' '.join(argv)} did not answer within {timeout:.0f}s: is slurmctld reachable?"
        ) from None


def slurmctld_unreachable(stderr: str) -> bool:
    """slurmctld did not answer (as opposed to refusing the request)."""
    text = stderr.lower()
    return any(
        word in text
        for word in ("unable to contact slurm controller", "connection refused", "timed out")
    )
