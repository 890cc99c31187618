"""Stopping on Slurm: a role's jobs end by themselves or are cancelled, through a
slurmctld outage, and are waited for until they have left the queue (:class:`JobStopper`,
the launcher's ``stop`` and ``close``; :func:`wait_gone`)."""

from __future__ import annotations

import logging
import subprocess
import time

from corral.backends.slurm.commands import (
    GRACEFUL_STOP_SECONDS,
    QUERY_TIMEOUT_SECONDS,
    STOP_TIMEOUT_SECONDS,
    run_command,
    slurmctld_unreachable,
)
from corral.backends.slurm.jobs import RoleJobs
from corral.backends.slurm.queue import state_is_final
from corral.errors import SchedulerError

log = logging.getLogger("corral")


class JobStopper:
    """Ends the jobs of a role that ``jobs`` holds, and forgets them."""

    def __init__(self, jobs: RoleJobs) -> None:
        self.jobs = jobs

    def stop(self, role: str) -> None:
        """The role's jobs are cancelled at once (one job holds every rank: no order)."""
        with self.jobs.lock:
            jobs = self.jobs.by_role.pop(role, [])
            self.jobs.specs.pop(role, None)
        if not jobs:
            return
        ids = [j.job_id for j in jobs]
        # The core has asked the workers to exit: a job whose tasks all ended completes by
        # itself, faster than scancel's SIGTERM -> KillWait -> SIGKILL; scancel follows.
        deadline = time.monotonic() + GRACEFUL_STOP_SECONDS
        for job_id in ids:
            wait_gone(job_id, max(0.0, deadline - time.monotonic()), warn=False)
        deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
        while True:  # through a slurmctld outage: retry until it answers
            try:
                r = run_command(["scancel", *ids], timeout=QUERY_TIMEOUT_SECONDS)
            except SchedulerError as exc:
                r = subprocess.CompletedProcess([], 1, "", str(exc))
            if not (r.returncode != 0 and slurmctld_unreachable(r.stderr)):
                break
            if time.monotonic() >= deadline:
                log.warning(
                    "slurmctld did not answer for %.0fs: Slurm jobs %s may still run; "
                    "scancel them when it is back",
                    STOP_TIMEOUT_SECONDS,
                    " ".join(ids),
                )
                return
            time.sleep(1.0)
        if r.returncode != 0 and "Invalid job id" not in r.stderr:
            log.warning("scancel %s: %s", " ".join(ids), r.stderr.strip())
        for job_id in ids:
            wait_gone(job_id, max(0.0, deadline - time.monotonic()))
        self._reap_steps(role)

    def _reap_steps(self, role: str) -> None:
        """The srun clients of restart steps end with their job; reap them (by pid)."""
        for key in [k for k in self.jobs.steps if k[0] == role]:
            proc = self.jobs.steps.pop(key)
            try:
                proc.wait(5.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def close(self) -> None:
        for role in self.jobs.roles():
            try:
                self.stop(role)
            except Exception as exc:
                log.warning("stopping Slurm job of %s: %s", role, exc)


def wait_gone(job_id: str, timeout: float, warn: bool = True) -> bool:
    """Wait until the job has left squeue or reached a final state."""
    deadline = time.monotonic() + timeout
    interval = 0.05
    while True:
        try:
            r = run_command(
                ["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T"],
                timeout=QUERY_TIMEOUT_SECONDS,
            )
        except SchedulerError as exc:
            r = subprocess.CompletedProcess([], 1, "", f"timed out: {exc}")
        state = r.stdout.strip()
        if r.returncode != 0 and slurmctld_unreachable(r.stderr):
            pass  # slurmctld is down: the job's fate is unknown, keep asking
        elif r.returncode != 0 or not state or state_is_final(state):
            return True
        if time.monotonic() >= deadline:
            if not warn:
                return False
            log.warning(
                "Slurm job %s still %s %.0fs after scancel; check it with `scontrol show job %s`",
                job_id,
                state,
                timeout,
                job_id,
            )
            return False
        time.sleep(interval)
        interval = min(interval * 1.5, 0.5)
