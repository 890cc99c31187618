"""A real worker process, from its start until it has registered, imports nothing that
must stay lazy: the list of tests/unit/test_worker_start_lazy.py, plus the standard
library's heavier modules that a process which already has them loaded cannot check.

The worker runs under ``python -X importtime`` with stderr on its stdout pipe, so every
module it imports is listed, in order, before the line it prints once its name-resolve
records are written (``serving at``); what it imports after that line (on first use) is
not the start's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from corral.worker.env import DIE_WITH_PARENT, worker_environment
from tests.unit.test_worker_start_lazy import MUST_STAY_LAZY

#: standard-library modules a worker's start does without (each costs a share of a bare
#: ``python -c pass``): loaded on first use by the code that needs them
STDLIB_LAZY = (
    "dataclasses", "inspect", "typing", "logging", "argparse", "subprocess", "asyncio",
    "concurrent.futures", "tempfile", "shutil", "ctypes", "traceback", "encodings.idna",
    "ipaddress",  # rpc.peer_uid packs addresses with socket.inet_pton (issue 29)
)  # fmt: skip


def _started_worker_imports(tmp_path) -> list[str]:
    secret = tmp_path / "secret"
    secret.write_text("s" * 64)
    os.chmod(secret, 0o600)
    env = worker_environment(
        experiment="imports",
        trial="t0",
        role="w",
        index=0,
        name_resolve={"type": "nfs", "root": str(tmp_path / "records")},
        log_dir=str(tmp_path / "logs"),
        port_count=1,
        lease_timeout=30.0,
        cpu=1,
        secret_file=str(secret),
    )
    env[DIE_WITH_PARENT] = "1"  # as the local backend starts it
    env["CORRAL_PARENT_PID"] = str(os.getpid())
    proc = subprocess.Popen(
        [sys.executable, "-X", "importtime", "-m", "corral.worker"],
        env={**os.environ, **env},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    imported, seen = [], []
    try:
        for raw in proc.stdout:
            line = raw.decode(errors="replace")
            seen.append(line)
            if "serving at" in line:
                return imported
            if line.startswith("import time:") and "|" in line and "self [us]" not in line:
                imported.append(line.rsplit("|", 1)[1].strip())
        raise AssertionError("the worker ended before it registered:\n" + "".join(seen[-40:]))
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()


def test_a_started_worker_imported_nothing_that_must_stay_lazy(tmp_path):
    imported = _started_worker_imports(tmp_path)
    assert "corral.worker.runtime" in imported  # the listing is the worker's own
    lazy = MUST_STAY_LAZY + STDLIB_LAZY
    found = [m for m in imported if any(m == x or m.startswith(x + ".") for x in lazy)]
    assert found == [], f"a worker's start imported {found}; load them on first use"
