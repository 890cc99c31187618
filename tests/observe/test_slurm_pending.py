"""On Slurm, workers whose jobs wait in the queue are listed as starting, with the reason
squeue gives. Real lab cluster (4 nodes x 4 declared GPUs)."""

from __future__ import annotations

import os
import threading

import pytest

from corral import Job, SchedulingSpec
from corral.errors import WorkerTimeoutError
from tests.observe.helpers import wait_stats

BACKENDS = os.environ.get("CORRAL_TEST_BACKENDS", "local,ray,slurm").split(",")


@pytest.mark.slurm
@pytest.mark.parametrize("name", [b for b in ("slurm",) if b in BACKENDS])
def test_a_queued_slurm_worker_reads_starting_with_the_queue_reason(request, name):
    backend = request.getfixturevalue(f"{name}_backend")
    sched = backend.scheduler(startup_timeout=20)
    try:
        nodes = 4
        gpus = backend.gpus_per_node
        sched.create_workers(
            Job(role="hog", replicas=nodes, tasks=[SchedulingSpec(cpu=1, gpu=gpus)])
        )
        failed: list[BaseException] = []

        def waiting():
            try:
                sched.create_workers(
                    Job(role="late", replicas=1, tasks=[SchedulingSpec(cpu=1, gpu=1)])
                )
            except BaseException as exc:  # expected: WorkerTimeoutError
                failed.append(exc)

        thread = threading.Thread(target=waiting)
        thread.start()
        snap = wait_stats(
            sched,
            lambda s: any(
                w["id"] == "late/0"
                and "PENDING (" in (w["reason"] or "")
                and "(None)" not in w["reason"]
                for w in s["workers"]
            ),
            what="late/0 starting with the queue's reason",
        )
        row = next(w for w in snap["workers"] if w["id"] == "late/0")
        assert row["state"] == "starting" and "pid" not in row
        assert "Resources" in row["reason"] or "Priority" in row["reason"], row["reason"]
        assert "Slurm job" in row["reason"]
        thread.join(timeout=60)
        assert failed and isinstance(failed[0], WorkerTimeoutError)
    finally:
        sched.close()
