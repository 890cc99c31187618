"""What a dead controller of a trial left on Slurm: its queued or running jobs (named
``<experiment>:<trial>:<role>``), cancelled by ``corral stop`` (through the backend
registry, corral.backends) and by a new controller's ``remove_leftovers``."""

from __future__ import annotations

import shutil

from corral.backends.slurm.commands import run_command
from corral.safedirs import user_name


def cancel_trial_jobs(experiment: str, trial: str) -> list[str]:
    """scancel every queued or running job of a trial (jobs are named exp:trial:role) that
    belongs to this user: ``-u`` keeps an admin from cancelling other users' jobs."""
    r = run_command(["squeue", "-h", "-u", user_name(), "-o", "%i|%j"])
    prefix = f"{experiment}:{trial}:"
    ids = [
        line.split("|", 1)[0]
        for line in r.stdout.splitlines()
        if "|" in line and line.split("|", 1)[1].startswith(prefix)
    ]
    if ids:
        run_command(["scancel", *ids])
    return ids


def stop_trial_leftovers(experiment: str, trial: str) -> list[str]:
    """``corral stop``'s question to Slurm: one line per job of the trial cancelled; none
    where this host has no Slurm client (``squeue`` not on PATH)."""
    if shutil.which("squeue") is None:
        return []
    return [f"cancelled Slurm job {job_id}" for job_id in cancel_trial_jobs(experiment, trial)]
