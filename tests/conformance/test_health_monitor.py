"""The background health monitor notices a worker's death with no call in flight, tells
the user's callback, and `corral ps` (another process) shows it."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading

from corral import Job, SchedulingSpec


def test_death_is_reported_to_the_callback_and_in_ps_without_any_call(backend):
    deaths: list[tuple[str, object]] = []
    seen = threading.Event()

    def on_death(worker_id, exit_):
        deaths.append((worker_id, exit_))
        seen.set()

    sched = backend.scheduler(on_worker_death=on_death)
    try:
        # two roles: on Slurm one dead task ends its whole role (fail-fast step)
        one = [SchedulingSpec(cpu=1)]
        (bystander,) = sched.create_workers(Job(role="bystander", replicas=1, tasks=one))
        (watched,) = sched.create_workers(Job(role="watched", replicas=1, tasks=one))
        ids = [bystander, watched]
        assert sched.worker_status() == {ids[0]: "alive", ids[1]: "alive"}
        victim = sched.get_workers("watched")[0]
        backend.kill_worker(victim, signal.SIGKILL)
        # no call to any worker from here on: only the monitor can notice
        assert seen.wait(30), "the health monitor never reported the death"
        assert [d[0] for d in deaths] == [ids[1]]
        assert deaths[0][1].reason
        status = sched.worker_status()
        assert status[ids[0]] == "alive"
        assert status[ids[1]].startswith("dead: ")
        ps = subprocess.run(
            [sys.executable, "-m", "corral.cli", "--fileroot", backend.fileroot, "ps"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert ps.returncode == 0, ps.stderr
        rows = [line for line in ps.stdout.splitlines() if sched.trial_name in line]
        assert any("watched/0" in r and "dead (" in r for r in rows), ps.stdout
        assert any("bystander/0" in r and " ok" in r for r in rows), ps.stdout
        assert any(sched.run_id in r for r in rows), ps.stdout
    finally:
        sched.close()
