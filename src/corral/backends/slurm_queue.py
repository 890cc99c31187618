"""What Slurm says about jobs: the job states corral tells apart, the one batched
``squeue``/``scontrol`` query per poll (cached briefly, and patient through a slurmctld
outage), the commands' runner, and the ending of a job read from its logs."""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field

from corral.errors import SchedulerError

log = logging.getLogger("corral")

SQUEUE_CACHE_SECONDS = 0.5
STOP_TIMEOUT_SECONDS = 60.0
COMMAND_TIMEOUT_SECONDS = 60.0
GRACEFUL_STOP_SECONDS = 5.0
QUERY_TIMEOUT_SECONDS = 3.0
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


# ---------------------------------------------------------------- commands --
def _require(command: str) -> str:
    path = shutil.which(command)
    if path is None:
        raise SchedulerError(
            f"{command} not found: is this a Slurm login node? Install the Slurm client "
            "commands or put them on PATH."
        )
    return path


def _run(
    argv: list[str], timeout: float = COMMAND_TIMEOUT_SECONDS, umask: int = -1
) -> subprocess.CompletedProcess:
    _require(argv[0])
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


def _unreachable(stderr: str) -> bool:
    """slurmctld did not answer (as opposed to refusing the request)."""
    text = stderr.lower()
    return any(
        word in text
        for word in ("unable to contact slurm controller", "connection refused", "timed out")
    )


@dataclass
class JobState:
    state: str
    reason: str = ""
    exit_code: int | None = None
    nodes: str = ""
    completing: bool = False
    """Still COMPLETING (processes being killed); ``state`` is then the base state."""


@dataclass
class RoleJob:
    """One sbatch job of a role: the role's first job, or one that restarted a replica."""

    job_id: str
    indices: list[int]
    """The replicas this job runs now (a restarted replica moves to its own job)."""
    log_dir: str
    script: str
    seen_active: bool = False
    requeues_seen: int = 0
    exits_seen: set[int] = field(default_factory=set)
    """Replicas whose exit file was seen (the job's state is looked up afresh for a new one)."""


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
        r = _run(
            ["squeue", "-h", "-t", "all", "-j", ",".join(job_ids), "-o", "%i|%T|%r|%N"],
            timeout=QUERY_TIMEOUT_SECONDS,
        )
        if r.returncode != 0 and _unreachable(r.stderr):
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
            r = _run(["scontrol", "show", "job", "-o", job_id], timeout=QUERY_TIMEOUT_SECONDS)
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


def _read_exit_file(path: str) -> int | None:
    try:
        with open(path) as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return None


def _describe_code(code: int) -> str:
    if code > 128:
        import signal

        try:
            return f"killed by {signal.Signals(code - 128).name} (exit status {code})"
        except ValueError:
            pass
    return f"exited with code {code}"
