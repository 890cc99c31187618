"""The controller's open-file pre-check estimates what a backend's workers really cost it
(``Launcher.fds_per_worker``), so a role that fits is not refused and one that does not
fit is refused before anything starts (issue 24, defect 8)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

from corral import Job

REPLICAS = 8


def fds_by_kind(log_dir: str) -> dict[str, int]:
    """The controller's descriptors: pipes and sockets, files under the log directory,
    the rest."""
    counts = {"pipe+socket": 0, "log": 0, "other": 0}
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(("pipe:", "socket:")):
            counts["pipe+socket"] += 1
        elif target.startswith(log_dir):
            counts["log"] += 1
        else:
            counts["other"] += 1
    return counts


def test_real_workers_cost_the_controller_at_most_the_estimate_under_fan_out(sched):
    """Real workers, after a fan-out that opens a connection to each: the pipes and sockets
    the controller added per worker stay within ``fds_per_worker``; log files are shared
    (at most 16 open, within fdlimit.MARGIN)."""
    sched.create_workers(Job(role="first", replicas=1))
    echo = "corral.testing.engines.EchoEngine"

    async def measure() -> tuple[dict[str, int], dict[str, int]]:
        # the fixed costs first: this event loop, the controller's clients, a log file
        await sched.create_engine("first/0", echo)
        await sched.async_call_engine("first/0", "echo", None, 1)
        before = fds_by_kind(str(sched.log_dir))
        job = Job(role="many", replicas=REPLICAS)
        ids = await asyncio.to_thread(sched.create_workers, job)
        for wid in ids:
            await sched.create_engine(wid, echo)
        for _ in range(3):  # several rounds, each one call per worker at once
            await asyncio.gather(*(sched.async_call_engine(w, "echo", None, 1) for w in ids))
        return before, fds_by_kind(str(sched.log_dir))  # this loop's connections still open

    before, after = asyncio.run(measure())
    per_worker = (after["pipe+socket"] - before["pipe+socket"]) / REPLICAS
    assert per_worker <= sched.launcher.fds_per_worker, (per_worker, before, after)
    assert after["log"] <= 16


AT_1024 = """
import resource, sys
from corral.backends.local import LocalScheduler
from corral.fdlimit import ensure_fds
resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))
s = LocalScheduler(gpu_devices=[], fileroot=sys.argv[1], experiment_name="fds", trial_name="t")
try:
    ensure_fds(int(sys.argv[2]) * s.launcher.fds_per_worker, "role 'big'")  # the pre-check
finally:
    s.close()
print("fits")
"""


def test_256_local_workers_pass_the_pre_check_at_ulimit_1024_and_2048_do_not(tmp_path):
    """At ``ulimit -n 1024`` a controller has room for 256 local workers (measured above:
    at most ``fds_per_worker`` each); 2,048 are refused before anything starts."""

    def run(n: int) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-c", AT_1024, str(tmp_path), str(n)],
            capture_output=True,
            text=True,
            timeout=120,
        )

    fits = run(256)
    assert fits.returncode == 0 and fits.stdout.strip() == "fits", fits.stderr
    refused = run(2048)
    assert refused.returncode != 0 and "ResourceLimitError" in refused.stderr, refused.stderr
    assert "ulimit -n" in refused.stderr
