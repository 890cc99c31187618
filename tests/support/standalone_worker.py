"""The environment of a worker started by hand (``python -m corral.worker``), as the local
backend would start it: a secret file, file-based name records and a controller lease.

Tests that start one worker without a scheduler (its imports, its parent watch, its fork
template) share this instead of each spelling out ``worker_environment``.
"""

from __future__ import annotations

import os
from pathlib import Path

from corral.discovery.files import FileNameResolve
from corral.discovery.signed import SignedNameResolve
from corral.name_resolve_keys import controller_key
from corral.worker.env import DIE_WITH_PARENT, worker_environment

SECRET = "s" * 64


def standalone_worker_env(
    tmp_path: Path,
    experiment: str,
    lease_timeout: float,
    engines: dict | None = None,
    parent_pid: int | None = None,
) -> dict[str, str]:
    """``os.environ`` plus a worker's variables: role ``w``, index 0, trial ``t0``, one
    port, one CPU, dying with its parent (``parent_pid``: CORRAL_PARENT_PID, left to the
    caller when None). The controller's lease record is written, so the worker's watch
    does not stop it for want of a controller."""
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    os.chmod(secret, 0o600)
    env = worker_environment(
        experiment=experiment,
        trial="t0",
        role="w",
        index=0,
        name_resolve={"type": "nfs", "root": str(tmp_path / "records")},
        log_dir=str(tmp_path / "logs"),
        port_count=1,
        lease_timeout=lease_timeout,
        cpu=1,
        secret_file=str(secret),
        engines=engines,
    )
    env[DIE_WITH_PARENT] = "1"
    if parent_pid is not None:
        env["CORRAL_PARENT_PID"] = str(parent_pid)
    records = SignedNameResolve(FileNameResolve(str(tmp_path / "records")), SECRET)
    records.add(controller_key(experiment, "t0"), "{}", replace=True)
    return {**os.environ, **env}
