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

The lease is a signed record like the others. It is believed only when signed with this
run's key or with the key in the trial's secret file (another run of the same user, which
writes that file when it claims the trial); a lease signed with neither was forged by
someone who can write to the store: the renewing run ignores and overwrites it (it no
longer gives up its trial for one unsigned ``PUT``), and a new run treats it as dead.
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

from corral import name_resolve_keys
from corral.auth import TrialKeys, open_record, unverified_value
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
    return Lease.parse(nr.get(name_resolve_keys.controller_key(experiment, trial)))


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
        *,
        secret: str | None = None,
        trial_secret: Callable[[], str | None] = lambda: None,
    ):
        """``nr`` signs what it writes; ``secret`` (this run's) and ``trial_secret()`` (the
        one in the trial's secret file) are the keys a lease read back is checked with.
        Without ``secret``, leases are read unverified (as before signed leases)."""
        self.nr = nr
        self._keys = TrialKeys(secret) if secret else None
        self._trial_secret = trial_secret
        self._forged_seen = False
        self.experiment = experiment
        self.trial = trial
        self.key = name_resolve_keys.controller_key(experiment, trial)
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
        old, who = self._read()
        for _ in range(10):  # a live run writes its secret file just after its claim
            if who != "forged":
                break
            time.sleep(0.1)
            old, who = self._read()
        if who == "forged":
            log.warning(
                "the controller lease of %s/%s is signed by no run of this trial (forged: "
                "someone else can write to the store); it is treated as dead",
                self.experiment, self.trial,
            )  # fmt: skip
            old = None
        if who and old is None:
            old = Lease("", 0, "", 0.0)  # unreadable or forged: treat as dead
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
            holder, who = self._read()
            if holder is not None and who != "forged" and holder.run_id != self.beat.run_id:
                raise self._clash(holder) from None
            self.nr.add(self.key, self.beat.dump(), replace=True)
        self._stop = threading.Event()
        threading.Thread(
            target=self._renew, args=(self._stop,), name="corral-lease", daemon=True
        ).start()
        return removed

    def _read(self) -> tuple[Lease | None, str]:
        """The lease in the store and who signed it: ``"ours"`` (this run's key),
        ``"trial"`` (the key in the trial's secret file), ``"forged"`` (a secret file
        exists and neither key signed it), ``"unverified"`` (nothing to check it with)
        or ``""`` (no lease)."""
        stored = getattr(self.nr, "inner", self.nr).get(self.key)
        if stored is None:
            return None, ""
        if self._keys is None:
            return Lease.parse(stored), "unverified"
        value = open_record(self._keys, self.key, stored)
        if value is not None:
            return Lease.parse(value), "ours"
        other = self._trial_secret()
        if not other:  # nothing to check another run's lease with: believed, as before
            return Lease.parse(stored), "unverified"
        value = open_record(TrialKeys(other), self.key, stored)
        if value is not None:
            return Lease.parse(value), "trial"
        return Lease.parse(stored), "forged"

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
                current, who = self._read()
                if who == "forged":
                    if not self._forged_seen:
                        log.warning(
                            "the controller lease of %s/%s was overwritten with a record "
                            "signed by no run of this trial (forged); ignored and rewritten",
                            self.experiment, self.trial,
                        )  # fmt: skip
                    self._forged_seen = True
                elif current is not None and current.run_id != self.beat.run_id:
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
            current, who = self._read()
            if current is None or who == "forged" or current.run_id == self.beat.run_id:
                self.nr.delete(self.key)
        except Exception:
            pass


def registered_workers(nr: NameResolve, experiment: str, trial: str) -> dict[str, dict]:
    """``role/index`` -> {address, pid, host, run_id, ...} of every worker registered
    under the trial (whatever run started it)."""
    root = name_resolve_keys.trial_root(experiment, trial)
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
