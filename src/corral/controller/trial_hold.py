"""Holding a trial while this run has workers: the controller lease (``corral.controller.run_lease``:
claimed before anything starts, renewed every second, a dead run's leftovers cleaned
up), the trial secret file, the stats file of ``corral dashboard`` and the background
health monitor. All are taken together with the first role and given back with the last.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import InitVar, dataclass, field
from typing import Any

from corral.controller.leftovers import clean_dead_run
from corral.controller.run_lease import ControllerLease, Lease
from corral.discovery.signed import SignedNameResolve
from corral.safedirs import make_private_subdir, write_exclusive


@dataclass(kw_only=True, eq=False)
class TrialHold:
    name_resolve: SignedNameResolve
    experiment: str
    trial: str
    run_id: InitVar[str]
    lease_timeout: InitVar[float]
    grace: InitVar[float]
    secret: str
    secret_file: str
    remove_leftovers: Callable[[str, str], list[str]]
    stats: Any
    monitor: Any
    progress: Callable[[str], None]
    wrote_secret: bool = field(default=False, init=False)
    lease: ControllerLease = field(init=False)

    def __post_init__(self, run_id: str, lease_timeout: float, grace: float) -> None:
        self.lease = ControllerLease(
            SignedNameResolve(self.name_resolve.inner, self.secret, lenient=True),
            self.experiment,
            self.trial,
            run_id,
            lease_timeout,
            grace,
            secret=self.secret,
            trial_secret=self.read_secret,
        )

    @property
    def held(self) -> bool:
        return self.lease.held

    def read_secret(self) -> str | None:
        try:
            with open(self.secret_file) as fh:
                return fh.read().strip() or None
        except OSError:
            return None

    def write_secret(self) -> None:
        """Written when the run claims its trial (never by a dry run): a second live
        controller is refused before it gets here, a dead run's file is replaced, and
        the file is created exclusively (0600, no symlink followed) in a 0700 directory."""
        make_private_subdir(os.path.dirname(self.secret_file))
        write_exclusive(self.secret_file, self.secret)
        self.wrote_secret = True

    def remove_secret(self) -> None:
        """At close: delete the secret file if it is still this run's."""
        if self.wrote_secret and self.read_secret() == self.secret:
            try:
                os.unlink(self.secret_file)
            except OSError:
                pass

    def hold(self, attach: bool = False) -> list[str]:
        """Claim the trial (no-op if held); returns what a dead run left and was removed.
        The secret is written only now: a second live controller, refused by the claim,
        must not overwrite the secret of the run it would clash with. ``attach``: this
        controller continues the run of the lease (same run id and secret, see
        corral.controller.adoption): nothing is cleaned up and the secret file is kept."""
        if self.lease.held:
            return []
        old_secret = self.read_secret()

        def cleanup(old: Lease) -> list[str]:
            old_records = self.name_resolve.inner  # the dead run's records: its own key
            records = SignedNameResolve(old_records, old_secret) if old_secret else old_records
            removed = clean_dead_run(
                records,
                self.experiment,
                self.trial,
                old,
                old_secret,
                self.remove_leftovers,
            )
            if removed:
                self.progress(
                    f"cleaned up after the dead controller of {self.experiment}/{self.trial} "
                    f"({old.describe()}): " + "; ".join(removed)
                )
            return removed

        removed = self.lease.claim(cleanup)
        if not attach:
            self.write_secret()
        self.stats.start()  # the stats file for corral dashboard / top (checks its env first)
        self.monitor.start()
        return removed

    def release(self) -> None:
        self.monitor.stop()
        if self.lease.held:
            self.stats.stop()
        self.lease.release()
