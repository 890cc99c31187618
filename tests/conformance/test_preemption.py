"""Preemption (``requeue=True``): the cluster takes a role's workers away and gives the
role its resources back later. Each backend preempts the way its cluster does (Slurm
requeues the job, Ray drains then loses the node: ``Preemption`` in harness.py); what the
user sees is the same. Engines hear ``on_preempt`` first, calls raise
WorkerPreemptedError that says to use ``wait_role``, a preempted worker is never restarted
in place even with restarts allowed, and ``wait_role`` returns the same worker ids with new
generations after the restart hook recreated each engine once."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from corral import WorkerPreemptedError

ECHO = "corral.testing.engines.EchoEngine"


def _first_preempted_error(sched, worker_id: str) -> WorkerPreemptedError:
    """Calls fail once the worker is gone; until then they may answer or fail otherwise."""
    deadline = time.monotonic() + 60
    while True:
        try:
            sched.call_engine(worker_id, "echo", "e", 1, rpc_meta={"timeout": 5})
        except WorkerPreemptedError as exc:
            return exc
        except Exception:
            pass  # not seen as preempted yet: the connection just failed
        assert time.monotonic() < deadline, "calls never raised WorkerPreemptedError"
        time.sleep(0.2)


@pytest.mark.timeout(240)
def test_a_preempted_role_fails_with_preempted_error_then_wait_role_brings_it_back(
    backend, tmp_path
):
    backend.require("preemption")
    with backend.preemption() as cluster:
        sched = backend.scheduler(requeue=True, startup_timeout=90)
        try:
            made: list[str] = []

            def hook(s, worker_id):
                asyncio.run(s.create_engine(worker_id, ECHO, "e"))
                made.append(worker_id)

            sched.set_restart_hook("spot", hook)
            ids = sched.create_workers(cluster.job("spot", 2, max_restarts=1))
            markers = [str(tmp_path / f"preempted-{i}") for i in range(len(ids))]
            for wid, marker in zip(ids, markers, strict=True):
                asyncio.run(sched.create_engine(wid, ECHO, "e"))
                sched.call_engine(wid, "mark_preempt", "e", marker)
            before = sched.get_workers("spot")

            cluster.warn(sched, "spot")
            deadline = time.monotonic() + 30  # engines hear it while their processes live
            while not all(os.path.exists(m) for m in markers):
                assert time.monotonic() < deadline, "on_preempt was not called"
                time.sleep(0.1)
            for marker in markers:
                with open(marker) as fh:
                    assert cluster.heard in fh.read()

            cluster.take(sched, "spot")
            error = _first_preempted_error(sched, ids[0])
            assert "wait_role" in str(error) and not error.restarted, str(error)
            assert "restarted it" not in str(error) and "restarting it" not in str(error)
            with pytest.raises(WorkerPreemptedError):
                sched.get_workers("spot")
            assert made == []  # no restart in place while preempted

            cluster.give_back(sched, "spot")
            assert sched.wait_role("spot", timeout=90) == ids
            after = sched.get_workers("spot")
            assert all(a.generation != b.generation for a, b in zip(after, before, strict=True))
            assert made == ids  # the hook recreated each engine once, after the return
            assert [sched.call_engine(w, "echo", "e", 7) for w in ids] == [7, 7]
            cluster.check_back(sched, "spot")
        finally:
            sched.close()
    assert backend.leftovers(sched.experiment_name, sched.trial_name) == []
