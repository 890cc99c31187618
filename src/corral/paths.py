"""Where a trial's files live: logs, the secret, name-resolve records.

The one owner of these paths. The controller knows the fileroot
(``TrialPaths.of(fileroot, experiment, trial)``); a worker or a rendered script knows
only its log directory (``TrialPaths.at(log_dir)``); both name a file the same way. A backend's own files (Slurm's batch scripts, batch log,
exit and place files) are its package's (corral.backends.slurm.job_files).
"""

from __future__ import annotations

import os
from collections import namedtuple

from corral.errors import ConfigError
from corral.safedirs import user_name

MERGED_LOG_NAME = "merged.log"


def logs_root(fileroot: str) -> str:
    """``<fileroot>/logs/<user>``: one directory per experiment below it."""
    return os.path.join(fileroot, "logs", user_name())


def records_root(fileroot: str) -> str:
    """The default name-resolve directory (``nfs`` records) under a fileroot."""
    return os.path.join(fileroot, "name_resolve")


def check_dir(path: str, field_name: str, create: bool = True) -> None:
    """ConfigError (field, path, fix) unless ``path`` is, or can become, a writable
    directory. ``create=False`` checks without creating anything (dry runs)."""
    if create:
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as exc:
            raise ConfigError(
                field_name, path, f"cannot create it ({exc.strerror}); use a writable directory"
            ) from None
    existing = os.path.abspath(path)
    while not os.path.lexists(existing):  # a dangling symlink is in the way too
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise ConfigError(
            field_name, path, f"cannot create it ({existing} is a file); use a writable directory"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(field_name, path, "it is not writable; use a writable directory")


def secret_dir(fileroot: str, experiment: str, trial: str) -> str:
    """The trial's private directory (0700): its secret and the controller's stats."""
    return os.path.join(fileroot, "secrets", experiment, trial)


def secret_file(fileroot: str, experiment: str, trial: str) -> str:
    return os.path.join(secret_dir(fileroot, experiment, trial), "secret")


def stats_file(fileroot: str, experiment: str, trial: str) -> str:
    """The controller's stats snapshot that ``corral dashboard`` and ``corral top`` read."""
    return os.path.join(secret_dir(fileroot, experiment, trial), "stats.json")


def metrics_token_file(fileroot: str, experiment: str, trial: str) -> str:
    """The bearer token a Prometheus scraper sends to the controller's ``/metrics``."""
    return os.path.join(secret_dir(fileroot, experiment, trial), "metrics.token")


class TrialPaths(
    namedtuple(
        "TrialPaths", ("log_dir", "fileroot", "experiment", "trial"), defaults=(None, None, None)
    )
):
    """The files of one trial. ``fileroot`` is None where only ``log_dir`` is known.

    ``log_dir``: str; ``fileroot``, ``experiment``, ``trial``: str or None. A named tuple
    (immutable, compared by value), not a dataclass: a worker's first fork imports the
    log pump, and with it this module, without ``dataclasses`` (and ``inspect``)."""

    __slots__ = ()

    @classmethod
    def of(
        cls, fileroot: str, experiment: str, trial: str, log_dir: str | None = None
    ) -> TrialPaths:
        """A trial's paths; ``log_dir`` replaces ``<fileroot>/logs/<user>/<exp>/<trial>``."""
        if log_dir is None:
            log_dir = os.path.join(logs_root(fileroot), experiment, trial)
        return cls(log_dir, fileroot, experiment, trial)

    @classmethod
    def at(cls, log_dir: str) -> TrialPaths:
        return cls(log_dir)

    # ------------------------------------------------------------------ logs
    def replica_log(self, role: str, index: int) -> str:
        """One worker's output: ``<log_dir>/<role>/<index>.log``."""
        return os.path.join(self.log_dir, role, f"{index}.log")

    def role_log(self, role: str) -> str:
        """Every worker of a role, each line prefixed ``[role/index] ``."""
        return os.path.join(self.log_dir, f"{role}.log")

    def merged_log(self) -> str:
        """Every worker of every role, each line prefixed ``[role/index] ``."""
        return os.path.join(self.log_dir, MERGED_LOG_NAME)

    # ------------------------------------------------------- secret, records
    def _root(self) -> str:
        if self.fileroot is None or self.experiment is None or self.trial is None:
            raise ValueError("these paths were made from a log directory only")
        return self.fileroot

    @property
    def secret_file(self) -> str:
        return secret_file(self._root(), self.experiment, self.trial)  # type: ignore[arg-type]

    @property
    def stats_file(self) -> str:
        return stats_file(self._root(), self.experiment, self.trial)  # type: ignore[arg-type]

    @property
    def metrics_token_file(self) -> str:
        return metrics_token_file(self._root(), self.experiment, self.trial)  # type: ignore[arg-type]

    @property
    def records(self) -> str:
        return records_root(self._root())


def replica_log_path(log_dir: str, role: str, index: int) -> str:
    return TrialPaths.at(log_dir).replica_log(role, index)


def role_log_path(log_dir: str, role: str) -> str:
    return TrialPaths.at(log_dir).role_log(role)


def merged_log_path(log_dir: str) -> str:
    return TrialPaths.at(log_dir).merged_log()


def log_dir_for(fileroot: str, experiment: str, trial: str) -> str:
    return TrialPaths.of(fileroot, experiment, trial).log_dir
