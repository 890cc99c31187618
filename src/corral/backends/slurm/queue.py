"""What Slurm's queue says about jobs: the job states corral tells apart, and the one
batched ``squeue``/``scontrol`` query per poll (cached briefly, and patient through a
slurmctld outage)."""

from __future__ import annotations

import logging
import re
import threading
import time
from dataclasses import dataclass

from corral.backends.slurm.commands import (
    QUERY_TIMEOUT_SECONDS,
    run_command,
    slurmctld_unreachable,
)
from corral.errors import SchedulerError

log = logging.getLogger("corral")

SQUEUE_CACHE_SECONDS = 0.5
OUTAGE_RETRY_SECONDS = 5.0

# ------------------------------------------------------------------ job states --
PENDING = "pending"  # queued: workers not started (yet)
ACTIVE = "active"  # the job's processes exist (running, or stopped while suspended)
ENDED = "ended"  # the job is over or ending: its workers are dead or dying
UNKNOWN = "unknown"  # a state this module does not know: assume nothing

_STATE_KINDS = {
    "PENDING": PENDING,
    "CONFIGURING": PENDING,
    "REQUEUED": PENDING,
    "REQUEUE_HOLD": PENDING,
    "REQUEUE_FED": PENDING,
    "RESV_DEL_HOLD": PENDING,
    "RUNNING": ACTIVE,
    "SUSPENDED": ACTIVE,
    "STOPPED": ACTIVE,
    "SIGNALING": ACTIVE,
    "RESIZING": ACTIVE,
    "STAGE_OUT": ACTIVE,
    "COMPLETING": ENDED,
    "COMPLETED": ENDED,
    "FAILED": ENDED,
    "CANCELLED": ENDED,
    "TIMEOUT": ENDED,
    "NODE_FAIL": ENDED,
    "PREEMPTED": ENDED,
    "OUT_OF_MEMORY": ENDED,
    "BOOT_FAIL": ENDED,
    "DEADLINE": ENDED,
    "SPECIAL_EXIT": ENDED,
    "REVOKED": ENDED,
}


def normalize_state(state: str | None) -> str:
    """``"CANCELLED by 0"``, ``"cancelled+"`` -> ``"CANCELLED"``; empty -> ``"UNKNOWN"``."""
    words = (state or "").strip().split()
    return words[0].rstrip("+").upper() if words else "UNKNOWN"


def classify_state(state: str | None) -> str:
    """The kind of a Slurm job state: PENDING, ACTIVE, ENDED or UNKNOWN (module constants)."""
    return _STATE_KINDS.get(normalize_state(state), UNKNOWN)


def state_is_final(state: str | None) -> bool:
    """Ended and done cleaning up: no process of the job is left (COMPLETING is not final)."""
    name = normalize_state(state)
    return classify_state(name) == ENDED and name != "COMPLETING"


def describe_state(job_id: str, state: str | None, reason: str | None = None) -> str:
    """``"Slurm job 12 PENDING (Resources)"``, ``"Slurm job 12 CANCELLED"``."""
    name = normalize_state(state)
    text = f"Slurm job {job_id} {name}"
    if reason and reason not in ("None", "(null)") and name in ("PENDING", "REQUEUED"):
        text += f" ({reason})"
    return text


def parse_exit_code(text: str | None) -> int | None:
    """Slurm's ``ExitCode=code:signal`` -> the exit code, or ``-signal`` if it was killed."""
    m = re.match(r"^\s*(\d+):(\d+)\s*$", text or "")
    if not m:
        return None
    code, sig = int(m.group(1)), int(m.group(2))
    return -sig if sig else code


@dataclass
class JobState:
    state: str
    reason: str = ""
    exit_code: int | None = None
    nodes: str = ""
    completing: bool = False
    """Still COMPLETING (processes being killed); ``state`` is then the base state."""


class SlurmQueue:
    """Job states from one ``squeue`` call for every job asked about, cached briefly;
    ``scontrol show job`` for jobs that have left squeue's view."""

    def __init__(self, cache_seconds: float = SQUEUE_CACHE_SECONDS):
        self.cache_seconds = cache_seconds
        self._lock = threading.Lock()
        self._states: dict[str, JobState] = {}
        self._at = -1e9
        self._asked: frozenset[str] = frozenset()
        self._final: dict[str, JobState] = {}
        self._retry_at = 0.0
        self.outage_since: float | None = None

    def states(self, job_ids: list[str]) -> dict[str, JobState]:
        """Job states; while slurmctld does not answer, the last known ones (an outage of
        the cluster manager is not a death: workers' own exit files still are)."""
        ids = frozenset(j for j in job_ids if j not in self._final)
        with self._lock:
            now = time.monotonic()
            fresh = now - self._at < self.cache_seconds
            if ids and not (fresh and ids <= self._asked) and now >= self._retry_at:
                try:
                    self._states = self._squeue(sorted(ids))
                    if self.outage_since is not None:
                        log.warning("slurmctld answers again after %.1fs", now - self.outage_since)
                    self.outage_since = None
                except SchedulerError as exc:
                    if self.outage_since is None:
                        self.outage_since = now
                        log.warning(
                            "slurmctld does not answer (%s); using the last known job states "
                            "and the workers' exit files until it does",
                            exc,
                        )
                    self._retry_at = time.monotonic() + OUTAGE_RETRY_SECONDS
                self._at = time.monotonic()
                self._asked = ids
            out = {}
            for job_id in job_ids:
                if job_id in self._final:
                    out[job_id] = self._final[job_id]
                    continue
                state = self._states.get(job_id)
                if self.outage_since is not None:
                    out[job_id] = state or JobState("UNKNOWN")
                    continue
                if state is None or classify_state(state.state) == ENDED:
                    # gone from squeue, or ended: scontrol knows the exit code
                    found = self._scontrol(job_id)
                    if found is not None and normalize_state(found.state) == "COMPLETING":
                        # Slurm says COMPLETING (not why) until every process is gone
                        found = JobState("COMPLETING", found.reason, None, found.nodes, True)
                    state = found or state or JobState("UNKNOWN")
                    self._states[job_id] = state
                    if state_is_final(state.state) and not state.completing:
                        self._final[job_id] = state
                out[job_id] = state
            return out

    def invalidate(self) -> None:
        with self._lock:
            self._at = -1e9

    @staticmethod
    def _squeue(job_ids: list[str]) -> dict[str, JobState]:
        r = run_command(
            ["squeue", "-h", "-t", "all", "-j", ",".join(job_ids), "-o", "%i|%T|%r|%N"],
            timeout=QUERY_TIMEOUT_SECONDS,
        )
        if r.returncode != 0 and slurmctld_unreachable(r.stderr):
            raise SchedulerError(f"squeue: {r.stderr.strip()}")
        if r.returncode != 0:
            if "Invalid job id" in r.stderr:
                return {}
            raise SchedulerError(f"squeue failed (exit {r.returncode}): {r.stderr.strip()}")
        found = {}
        for line in r.stdout.splitlines():
            parts = line.strip().split("|")
            if len(parts) >= 3:
                nodes = parts[3] if len(parts) > 3 else ""
                found[parts[0]] = JobState(parts[1], parts[2], None, nodes)
        return found

    @staticmethod
    def _scontrol(job_id: str) -> JobState | None:
        try:
            r = run_command(
                ["scontrol", "show", "job", "-o", job_id], timeout=QUERY_TIMEOUT_SECONDS
            )
        except SchedulerError:
            return None
        if r.returncode != 0:
            return None
        fields = dict(re.findall(r"(\w+)=(\S*)", r.stdout))
        if "JobState" not in fields:
            return None
        return JobState(
            fields["JobState"],
            fields.get("Reason", ""),
            parse_exit_code(fields.get("ExitCode")),
            fields.get("NodeList", ""),
        )
