"""The trial secret: made per controller run, written exclusively, removed at close.

The secret lives in the controller's memory from the start; the file that local and Slurm
workers read it from is written only when the first worker is launched (a dry run or a
scheduler that launches nothing writes nothing), under a name unique to this run
(``<fileroot>/secrets/<experiment>/<trial>/<run>.secret``, created with ``O_EXCL``, mode
0600, in 0700 directories), so a second controller of the same trial never replaces a
running trial's secret. ``remove()`` deletes it at close.
"""

from __future__ import annotations

import glob
import os
import secrets
import threading

from corral.safedirs import make_private_subdir

SUFFIX = ".secret"


def secrets_dir(fileroot: str, experiment: str, trial: str) -> str:
    return os.path.join(fileroot, "secrets", experiment, trial)


class TrialSecret:
    def __init__(self, fileroot: str, experiment: str, trial: str):
        self.value = secrets.token_hex(32)
        self.run_id = f"{os.getpid()}-{secrets.token_hex(4)}"
        self.directory = secrets_dir(fileroot, experiment, trial)
        self.path = os.path.join(self.directory, self.run_id + SUFFIX)
        self._written = False
        self._lock = threading.Lock()

    def file(self) -> str:
        """The secret file's path, written on first use."""
        with self._lock:
            if not self._written:
                make_private_subdir(self.directory)
                os.chmod(self.directory, 0o700)
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
                fd = os.open(self.path, flags, 0o600)
                with os.fdopen(fd, "w") as fh:
                    fh.write(self.value)
                self._written = True
            return self.path

    @property
    def written(self) -> bool:
        return self._written

    def remove(self) -> None:
        with self._lock:
            if self._written:
                try:
                    os.unlink(self.path)
                except FileNotFoundError:
                    pass
                self._written = False
            try:
                os.rmdir(self.directory)  # only if no other run's secret is left
            except OSError:
                pass


def candidate_secrets(fileroot: str, experiment: str, trial: str) -> list[str]:
    """Secrets of the trial's runs found on disk, newest first (for the CLI)."""
    found = []
    paths = glob.glob(os.path.join(secrets_dir(fileroot, experiment, trial), "*" + SUFFIX))
    for path in sorted(paths, key=_mtime, reverse=True):
        try:
            with open(path) as fh:
                found.append(fh.read().strip())
        except OSError:
            continue
    return found


def _mtime(path: str) -> float:
    try:
        return os.path.getmtime(path)
    except OSError:
        return 0.0
