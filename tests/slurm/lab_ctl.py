"""Take the lab cluster's slurmctld down and bring it back (warm: running jobs survive).

Follows .ci/slurm_cluster.sh: slurmctld runs from the lab's config, its pid in
``$LAB/run/slurmctld.pid``, inside the lab's bookkeeping cgroup with the lab marker in its
environment (so ``slurm_cluster.sh down`` still finds it). If the warm start fails, the
cluster is restored with ``slurm_cluster.sh up`` before the lock is released."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

from tests.conformance.backend_slurm import LAB, slurm_reachable
from tests.conformance.harness import pid_alive

ROOT = Path(__file__).resolve().parents[2]


def _ctld_pid() -> int | None:
    try:
        return int(Path(LAB, "run", "slurmctld.pid").read_text().strip())
    except (OSError, ValueError):
        return None


def _wait(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def start_slurmctld() -> None:
    """Warm start (no -c): slurmctld recovers its jobs from StateSaveLocation."""
    script = (
        'cg="/sys/fs/cgroup/pids/corral-slurm-$(printf %s "$LAB" | cksum | cut -d" " -f1)"; '
        '[ -w "$cg/cgroup.procs" ] && echo $$ > "$cg/cgroup.procs"; '
        'export CORRAL_SLURM_LAB="$LAB"; exec slurmctld'
    )
    subprocess.run(["bash", "-c", script], env={**os.environ, "LAB": LAB}, check=True)
    if not _wait(lambda: slurm_reachable() is None, 30):
        raise RuntimeError("slurmctld did not come back")


def restore_cluster() -> None:
    subprocess.run(
        ["bash", str(ROOT / ".ci" / "slurm_cluster.sh"), "up"],
        env={**os.environ, "CORRAL_SLURM_KEEP": "1"},
        check=True,
    )


@contextlib.contextmanager
def slurmctld_down():
    """slurmctld is stopped (SIGTERM, by its pid) inside the block, running again after."""
    pid = _ctld_pid()
    assert pid and pid_alive(pid), "the lab's slurmctld is not running"
    os.kill(pid, signal.SIGTERM)
    try:
        assert _wait(lambda: not pid_alive(pid), 30), "slurmctld did not stop"
        yield
    finally:
        try:
            start_slurmctld()
        except Exception:
            restore_cluster()
