"""Whether workers came up and whether they still live.

Waiting for registration (polling the backend for deaths meanwhile), reading a worker's
registration, turning a backend's ``WorkerExit`` into ``WorkerFailedError`` with the log
tail, and telling a dead worker from a live one after a broken connection.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass

from corral import name_resolve_keys
from corral.controller.role_table import LAUNCHED, RoleState, RoleTable
from corral.discovery.base import NameResolve
from corral.errors import (
    CorralError,
    PlacementError,
    SchedulerError,
    WorkerConnectionError,
    WorkerCreationError,
    WorkerFailedError,
    WorkerPreemptedError,
    WorkerTimeoutError,
)
from corral.foreign import PROBE_INTERVAL, answers_health, foreign_worker
from corral.launcher import Launcher, WorkerExit
from corral.logs import tail
from corral.paths import TrialPaths
from corral.spec import Worker

DEAD_CHECK_SECONDS = 1.5
STATUS_POLL_SECONDS = 0.25


@dataclass(kw_only=True, eq=False)
class WorkerWatch:
    experiment: str
    trial: str
    name_resolve: NameResolve
    launcher: Launcher
    roles: RoleTable
    paths: TrialPaths
    backend: str
    progress: Callable[[str], None]
    probe: Callable[[Worker], object] = lambda worker: None
    """Answers (returns) if the worker is reachable; set by the scheduler."""
    on_death: Callable[[Worker, WorkerFailedError], None] = lambda w, f: None
    """Called when a call finds its worker dead (the restart policy)."""

    # ---------------------------------------------------------------- registration
    def read_worker(self, role: str, index: int) -> Worker | None:
        address = self.name_resolve.get(
            name_resolve_keys.worker_address_key(self.experiment, self.trial, role, index)
        )
        if address is None:
            return None
        raw = self.name_resolve.get(
            name_resolve_keys.worker_info_key(self.experiment, self.trial, role, index)
        )
        info = json.loads(raw) if raw else {}
        return Worker.from_registration(role, index, address, info)  # backend_id from its env

    def read_foreign(self, role: str, index: int) -> Worker | None:
        """The replica as a foreign server, if its command answers GET /health on the port
        it was given (corral.foreign); None for a corral worker or one not up yet."""
        if self.launcher.commands is None:
            return None
        at = self.launcher.commands.served_at(role, index)
        if at is None or not answers_health(at.ip, at.ports[0]):
            return None
        return foreign_worker(role, index, at)

    def await_registration(self, role: str, replicas: int, timeout: float) -> list[Worker]:
        deadline = time.monotonic() + timeout
        found: dict[int, Worker] = {}
        next_poll = next_report = next_reason = next_probe = 0.0
        started = time.monotonic()
        last_reason: str | None = None
        interval = 0.005
        while True:
            now = time.monotonic()
            for index in range(replicas):
                if index not in found:
                    worker = self.read_worker(role, index)
                    if worker is not None:
                        found[index] = worker
            if len(found) < replicas and now >= next_probe:
                for index in range(replicas):
                    if index not in found:
                        worker = self.read_foreign(role, index)
                        if worker is not None:
                            found[index] = worker
                next_probe = time.monotonic() + PROBE_INTERVAL
            if len(found) == replicas:
                return [found[i] for i in range(replicas)]
            if now >= next_poll:
                dead = self.launcher.poll(role)
                if dead:
                    index, exit_ = sorted(dead.items())[0]
                    raise self.failure(f"{role}/{index}", exit_, role, index, "while starting")
                hopeless = self.launcher.hopeless(role)
                if hopeless:
                    raise PlacementError(
                        f"{role}: placement",
                        f"{replicas} worker(s)",
                        f"{role} can never be placed: {hopeless}. Lower replicas or "
                        "resources, or pick another partition",
                    )
                next_poll = now + STATUS_POLL_SECONDS
            if now >= next_reason and len(found) < replicas:
                reason = self.launcher.pending_reason(role)
                if reason and reason != last_reason and now - started > 1.0:
                    self.progress(f"waiting for {role} ({len(found)}/{replicas} ready): {reason}")
                    last_reason = reason
                next_reason = now + 1.0
            if now >= deadline:
                reason = self.launcher.pending_reason(role)
                missing = [f"{role}/{i}" for i in range(replicas) if i not in found]
                raise WorkerTimeoutError(
                    role,
                    timeout,
                    f"{len(missing)} of {replicas} {role} worker(s) not ready after {timeout:g}s "
                    f"({', '.join(missing[:8])})"
                    + (f"; backend says: {reason}" if reason else "")
                    + f". Check the logs in {self.paths.log_dir} or raise startup_timeout.",
                )
            if now >= next_report and now - (deadline - timeout) > 5:
                self.progress(f"waiting for {role}: {len(found)}/{replicas} ready")
                next_report = now + 5
            missing = replicas - len(found)
            wait_for_news(
                self.launcher,
                registration_poll(interval, missing, now - started),
                least=FINE_POLL_PER_MISSING * missing,
                waited=now - started,
            )
            interval = min(interval * 1.5, 0.05)

    def await_one(self, role: str, index: int, timeout: float) -> Worker:
        deadline = time.monotonic() + timeout
        next_reason, last_reason = time.monotonic() + 1.0, None
        while time.monotonic() < deadline:
            worker = self.read_worker(role, index) or self.read_foreign(role, index)
            if worker is not None:
                return worker
            dead = self.launcher.poll(role)
            if index in dead:
                raise self.failure(f"{role}/{index}", dead[index], role, index, "while restarting")
            hopeless = self.launcher.hopeless(role)
            if hopeless:
                raise WorkerCreationError(f"restarting {role}/{index} is impossible: {hopeless}")
            if time.monotonic() >= next_reason:
                reason = self.launcher.pending_reason(role)
                if reason and reason != last_reason:
                    self.progress(f"waiting for the restart of {role}/{index}: {reason}")
                    last_reason = reason
                next_reason = time.monotonic() + 1.0
            time.sleep(0.02)
        reason = self.launcher.pending_reason(role)
        raise WorkerTimeoutError(
            f"{role}/{index}",
            timeout,
            f"restarted worker {role}/{index} not ready after {timeout:.0f}s"
            + (f"; backend says: {reason}" if reason else ""),
        )

    # ---------------------------------------------------------------- deaths
    def failure(
        self, worker_id: str, exit_: WorkerExit, role: str, index: int, when: str
    ) -> WorkerFailedError:
        log_path = exit_.log_path or self.paths.replica_log(role, index)
        time.sleep(0.05)
        kind = WorkerPreemptedError if exit_.preempted else WorkerFailedError
        return kind(
            worker_id,
            exit_.exit_code,
            tail(log_path),
            reason=f"{exit_.reason} {when}",
            log_path=log_path,
        )

    def raise_if_dead(self, state: RoleState) -> None:
        owner = self.roles.owner(state)
        if owner.kind == LAUNCHED:
            dead = self.launcher.poll(owner.job.role)
            if dead:
                index, exit_ = sorted(dead.items())[0]
                raise self.failure(f"{owner.job.role}/{index}", exit_, owner.job.role, index, "")

    def diagnose(self, worker: Worker, cause: BaseException) -> SchedulerError | None:
        """After a broken connection: within about a second, tell a dead worker (an error
        to raise) from a live one that answers again (None: the call may be retried)."""
        owner_role = self.roles.process_role(worker)
        index = worker.index
        deadline = time.monotonic() + DEAD_CHECK_SECONDS
        while True:
            # the last look starts after the deadline: one poll can outlast it (a squeue
            # that times out while slurmctld is down) while the exit file appears
            last_look = time.monotonic() >= deadline
            dead = self.launcher.poll(owner_role) if owner_role in self.roles else {}
            if index not in dead and owner_role != worker.role:
                own = self.launcher.poll(worker.role)
                if index in own:
                    return self.failure(worker.id, own[index], worker.role, index, "during a call")
            if index in dead:
                kind = (
                    ""
                    if owner_role == worker.role
                    else f" (its host worker {owner_role}/{index} died)"
                )
                failure = self.failure(
                    worker.id, dead[index], worker.role, index, "during a call" + kind
                )
                self.on_death(worker, failure)
                return failure
            try:
                self.probe(worker)
                return None
            except (OSError, TimeoutError, SchedulerError, CorralError):
                pass
            if last_look:
                break
            time.sleep(0.05)
        log_path = self.paths.replica_log(worker.role, worker.index)
        return WorkerConnectionError(
            f"worker {worker.id} at {worker.address} does not answer ({cause}) although the "
            f"{self.backend} backend does not report it dead; see {log_path}"
        )


#: the first second of a start is polled finely: a worker is ready in tens of ms, and the
#: growing interval alone (5 ms, 7.5, 11, 17, 25, 38...) found one ~15-20 ms after it
#: registered (issue 29); a poll reads one record per missing worker, so the fine
#: interval grows with their number (<= 1,000 reads a second)
FINE_POLL_SECONDS = 1.0
FINE_POLL_PER_MISSING = 0.001


def registration_poll(interval: float, missing: int, waited: float) -> float:
    """Seconds to sleep before the next look for registrations: ``interval`` (the backoff,
    up to 50 ms), or during the first ``FINE_POLL_SECONDS`` at most the larger of 5 ms and
    1 ms per ``missing`` worker."""
    if waited < FINE_POLL_SECONDS:
        return min(interval, max(0.005, FINE_POLL_PER_MISSING * missing))
    return interval


def wait_for_news(
    launcher: Launcher, seconds: float, least: float = 0.0, waited: float = 0.0
) -> None:
    """Sleep ``seconds`` before the next look for registrations, or less: until the
    launcher's ``news`` (if it has one) says a worker may have registered, but at least
    ``least`` seconds (the looks of a wait among chatty workers stay as rare as the fine
    poll's: one record read per millisecond). Only within the fine poll's first
    ``FINE_POLL_SECONDS`` of the wait (``waited``): after it, output (a chatty running
    role, a slow model load's logs) does not make the looks more frequent than the
    backoff. Two waits at once may take each other's news: the other then looks at its
    next poll, as without news."""
    news = launcher.news
    if news is None or seconds <= least or waited >= FINE_POLL_SECONDS:
        time.sleep(seconds)
        return
    started = time.monotonic()
    news.wait(seconds)
    news.clear()  # before the look that follows: a record written after it sets it again
    rest = least - (time.monotonic() - started)
    if rest > 0:
        time.sleep(rest)
