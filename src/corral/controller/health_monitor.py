"""A background health monitor: worker deaths noticed while no call is in flight.

One thread per scheduler asks the backend (``Launcher.poll``) about every launched role
every ``interval`` seconds (0.25 s by default). A newly dead worker is

* recorded (``Scheduler.worker_status()``),
* written to name-resolve under ``<experiment>/<trial>/_health/<role>/<index>`` so that
  ``corral ps`` in another shell shows it,
* reported to the user's callback ``on_worker_death(worker_id, exit)`` (a
  :class:`~corral.launcher.WorkerExit`), called on the monitor thread,
* announced on the scheduler's progress output.

A backend that cannot answer for a while (slurmctld restarting, GCS blip) is logged and
retried; it never marks a worker dead. The monitor only observes: restarts still happen
on the next call (``max_restarts``), so callers see one consistent order of events.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from corral import name_resolve_keys
from corral.launcher import WorkerExit

log = logging.getLogger("corral")
DEFAULT_INTERVAL = 0.25


def health_key(experiment: str, trial: str, role: str, index: int) -> str:
    return name_resolve_keys.worker_health_key(experiment, trial, role, index)


@dataclass
class WorkerHealth:
    worker_id: str
    state: str  # "alive" | "dead"
    reason: str = ""
    exit_code: int | None = None
    at: float = 0.0  # wall clock when the death was noticed

    def dump(self, run_id: str) -> str:
        return json.dumps({**self.__dict__, "run_id": run_id})


class HealthMonitor:
    """Polls ``roles()`` through ``poll(role)``; see the module docstring."""

    def __init__(
        self,
        roles: Callable[[], dict[str, list[str]]],
        poll: Callable[[str], dict[int, WorkerExit]],
        record: Callable[[str, int, WorkerHealth], None],
        announce: Callable[[str], None],
        interval: float = DEFAULT_INTERVAL,
    ):
        """``roles()``: role -> worker ids (by index) to watch; ``record(role, index,
        health)``: persist a death (name-resolve)."""
        self._roles = roles
        self._poll = poll
        self._record = record
        self._announce = announce
        self.interval = interval
        self.callbacks: list[Callable[[str, WorkerExit], Any]] = []
        self.dead: dict[str, WorkerHealth] = {}
        self._reported: dict[str, WorkerExit] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.outage_since: float | None = None

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="corral-health", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(5.0)

    def forget(self, worker_id: str) -> None:
        """The worker was replaced (restart) or deleted: watch its successor afresh."""
        with self._lock:
            self.dead.pop(worker_id, None)
            self._reported.pop(worker_id, None)

    def status(self, watched: dict[str, list[str]]) -> dict[str, str]:
        """``worker_id -> "alive"`` or ``"dead: <reason>"`` for the workers of ``watched``
        (role -> worker ids), as far as this monitor knows."""
        status = {}
        for ids in watched.values():
            for worker_id in ids:
                dead = self.dead.get(worker_id)
                status[worker_id] = f"dead: {dead.reason}" if dead else "alive"
        return status

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.check_once()
            except Exception as exc:  # never let the monitor die
                log.debug("health monitor: %s", exc)

    def check_once(self) -> list[str]:
        """One round; returns the ids of workers newly found dead."""
        found = []
        for role, ids in self._roles().items():
            try:
                dead = self._poll(role)
            except Exception as exc:
                if self.outage_since is None:
                    self.outage_since = time.monotonic()
                    log.warning("health monitor: the backend does not answer (%s)", exc)
                continue
            if self.outage_since is not None:
                log.warning(
                    "health monitor: the backend answers again after %.1fs",
                    time.monotonic() - self.outage_since,
                )
                self.outage_since = None
            for index, exit_ in dead.items():
                if index >= len(ids):
                    continue
                worker_id = ids[index]
                if worker_id not in self._roles().get(role, ()):
                    continue  # deleted (or replaced) while polled: no death to record
                with self._lock:
                    if worker_id in self._reported:
                        continue
                    self._reported[worker_id] = exit_
                    health = WorkerHealth(
                        worker_id, "dead", exit_.reason, exit_.exit_code, time.time()
                    )
                    self.dead[worker_id] = health
                found.append(worker_id)
                self._report(role, index, worker_id, exit_, health)
        return found

    def _report(
        self, role: str, index: int, worker_id: str, exit_: WorkerExit, health: WorkerHealth
    ) -> None:
        try:
            self._record(role, index, health)
        except Exception as exc:
            log.debug("recording the death of %s: %s", worker_id, exc)
        self._announce(f"health: worker {worker_id} died: {exit_.reason}")
        for callback in list(self.callbacks):
            try:
                callback(worker_id, exit_)
            except Exception:
                log.exception("the on_worker_death callback raised for %s", worker_id)
