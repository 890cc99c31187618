"""Run identity: the controller lease of a trial, who holds it, and what a dead run left.

Every ``Scheduler`` is one *run* with its own id. The run claims its trial's lease in
name-resolve (``<experiment>/<trial>/_controller``) before it starts anything; the lease
names the run, its pid and host, and the wall-clock time of the last beat. Workers carry
their run id and exit when the lease is gone, stale, or held by another run, so a new
controller's heartbeats never keep an old run's workers alive.

Claiming a trial whose lease is held:

* by a live controller (its pid runs here, or its last beat is younger than the lease
  timeout): refused with :class:`~corral.errors.TrialInUseError` naming that run;
* by a dead one: its leftovers (registered workers, backend jobs/actors) are removed,
  each one printed, then the lease is taken.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from corral import keys
from corral.auth import unverified_value
from corral.discovery import NameResolve
from corral.errors import NameResolveError, TrialInUseError
from corral.procs import pid_alive

log = logging.getLogger("corral")
LEASE_BEAT_SECONDS = 1.0


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


@dataclass
class Lease:
    """What a controller writes in its trial's lease key, once a second."""

    run_id: str
    pid: int
    host: str
    t: float  # wall clock of the last beat
    n: int = 0
    grace: float = 0.0  # workers outlive this controller for this long (re-attach)

    def dump(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def parse(cls, raw: str | None) -> Lease | None:
        if not raw:
            return None
        try:
            data = json.loads(unverified_value(raw))  # signed records: the value only
            return cls(
                run_id=str(data.get("run_id", "")),
                pid=int(data.get("pid", 0)),
                host=str(data.get("host", "")),
                t=float(data.get("t", 0.0)),
                n=int(data.get("n", 0)),
                grace=float(data.get("grace", 0.0)),
            )
        except (ValueError, TypeError, AttributeError):
            return None

    def alive(self, lease_timeout: float) -> bool:
        """Is the controller that wrote this lease still running?"""
        if self.host == socket.gethostname() and self.pid and not pid_alive(self.pid):
            return False
        return time.time() - self.t <= lease_timeout + 1.0

    def describe(self) -> str:
        age = max(0.0, time.time() - self.t)
        return f"run {self.run_id or '?'} (controller pid {self.pid} on {self.host}, last beat {age:.1f}s ago)"


def read_lease(nr: NameResolve, experiment: str, trial: str) -> Lease | None:
    return Lease.parse(nr.get(keys.controller_key(experiment, trial)))


class ControllerLease:
    """The lease of one run: claimed once, renewed by one thread, dropped at the end."""

    def __init__(
        self,
        nr: NameResolve,
        experiment: str,
        trial: str,
        run_id: str,
        lease_timeout: float,
        grace: float = 0.0,
    ):
        self.nr = nr
        self.experiment = experiment
        self.trial = trial
        self.key = keys.controller_key(experiment, trial)
        self.lease_timeout = lease_timeout
        self.beat = Lease(run_id, os.getpid(), socket.gethostname(), time.time(), 0, grace)
        self._stop: threading.Event | None = None

    @property
    def held(self) -> bool:
        return self._stop is not None

    def claim(self, cleanup: Callable[[Lease], list[str]]) -> list[str]:
        """Take the trial's lease. A live holder: TrialInUseError. A dead one: ``cleanup``
        removes what it left (returns descriptions), then the lease is ours."""
        if self._stop is not None:
            return []
        removed: list[str] = []
        old = read_lease(self.nr, self.experiment, self.trial)
        raw_old = self.nr.get(self.key)
        if raw_old is not None and old is None:
            old = Lease("", 0, "", 0.0)  # unreadable (older corral): treat as dead
        if old is not None:
            if old.run_id == self.beat.run_id:
                pass  # our own lease, left by an earlier delete_workers race
            elif old.alive(self.lease_timeout):
                raise self._clash(old)
            else:
                removed = cleanup(old)
                self.nr.delete(self.key)
        self.beat.t = time.time()
        try:
            self.nr.add(self.key, self.beat.dump(), replace=False)
        except NameResolveError:
            holder = read_lease(self.nr, self.experiment, self.trial)
            if holder is not None and holder.run_id != self.beat.run_id:
                raise self._clash(holder) from None
            self.nr.add(self.key, self.beat.dump(), replace=True)
        self._stop = threading.Event()
        threading.Thread(
            target=self._renew, args=(self._stop,), name="corral-lease", daemon=True
        ).start()
        return removed

    def _clash(self, holder: Lease) -> TrialInUseError:
        return TrialInUseError(
            f"trial {self.experiment}/{self.trial} is in use by {holder.describe()}; this "
            f"controller (run {self.beat.run_id}) will not start workers under the same names. "
            f"Use another trial_name, wait for that run to end, or stop it with "
            f"`corral stop {self.experiment} {self.trial}` (its workers exit, and the next "
            "run cleans up what is left)",
            holder=holder,
        )

    def _renew(self, stop: threading.Event) -> None:
        while not stop.wait(LEASE_BEAT_SECONDS):
            self.beat.n += 1
            self.beat.t = time.time()
            try:
                current = Lease.parse(self.nr.get(self.key))
                if current is not None and current.run_id != self.beat.run_id:
                    log.error(
                        "the lease of %s/%s was taken by %s; this run's workers will exit",
                        self.experiment,
                        self.trial,
                        current.describe(),
                    )
                    return
                self.nr.add(self.key, self.beat.dump(), replace=True)
            except Exception as exc:
                log.warning("could not renew the controller lease: %s", exc)

    def release(self, delete: bool = True) -> None:
        if self._stop is None:
            return
        self._stop.set()
        self._stop = None
        if not delete:
            return
        try:
            current = Lease.parse(self.nr.get(self.key))
            if current is None or current.run_id == self.beat.run_id:
                self.nr.delete(self.key)
        except Exception:
            pass


def registered_workers(nr: NameResolve, experiment: str, trial: str) -> dict[str, dict]:
    """``role/index`` -> {address, pid, host, run_id, ...} of every worker registered
    under the trial (whatever run started it)."""
    root = keys.trial_root(experiment, trial)
    found: dict[str, dict] = {}
    for key, value in nr.get_subtree(root).items():
        parts = key.split("/")
        if len(parts) == 4 and not parts[2].startswith("_"):
            found.setdefault(f"{parts[2]}/{parts[3]}", {})["address"] = value
        elif len(parts) == 5 and parts[2] == "_info":
            try:
                info = json.loads(value)
            except ValueError:
                continue
            if isinstance(info, dict):
                found.setdefault(f"{parts[3]}/{parts[4]}", {}).update(info)
    return found
