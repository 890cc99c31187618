"""A request that can never be placed is refused at once with the reason, on every backend.

Each scheduler here has ``startup_timeout=600``: a backend that waited for the request
instead of refusing it would hang the test, not pass it. (How fast the refusal is:
benchmarks/faults.py.) GPUs are declared, not physical."""

from __future__ import annotations

import pytest

from corral import Job, PlacementError, SchedulingSpec


def test_more_gpus_than_the_cluster_has_in_total_is_refused(backend):
    total = backend.nodes * backend.gpus_per_node
    sched = backend.scheduler(startup_timeout=600)
    try:
        with pytest.raises(PlacementError) as info:
            sched.create_workers(
                Job(role="huge", replicas=total + 1, tasks=[SchedulingSpec(cpu=1, gpu=1)])
            )
        assert "huge" in str(info.value)
        assert "never be placed" in str(info.value) or "only" in str(info.value)
        assert sched.roles == []
    finally:
        sched.close()
    assert backend.leftovers(sched.experiment_name, sched.trial_name) == []


def test_a_worker_larger_than_any_node_is_refused(backend):
    # the configuration claims nodes twice as large as the cluster's: the backend's own
    # view of its nodes refuses the worker, not the configured n_gpus_per_node
    sched = backend.scheduler(startup_timeout=600, n_gpus_per_node=2 * backend.gpus_per_node)
    try:
        with pytest.raises(PlacementError) as info:
            sched.create_workers(
                Job(
                    role="wide",
                    replicas=1,
                    tasks=[SchedulingSpec(cpu=1, gpu=backend.gpus_per_node + 1)],
                )
            )
        assert str(backend.gpus_per_node + 1) in str(info.value)
        assert sched.roles == []
    finally:
        sched.close()
    assert backend.leftovers(sched.experiment_name, sched.trial_name) == []
