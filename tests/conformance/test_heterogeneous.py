"""Heterogeneous resources: per-role Slurm partition/constraint/reservation and Ray custom
resources and accelerator types; a name the cluster does not have is refused at once with
the values it does have (docs/shapes.md). Each scheduler has ``startup_timeout=600``: a
backend that queued the request instead of refusing it would hang the test."""

from __future__ import annotations

import pytest

from corral import Job, PlacementError, SchedulingSpec


def _refused(backend, spec: SchedulingSpec) -> str:
    sched = backend.scheduler(startup_timeout=600)
    try:
        with pytest.raises(PlacementError) as info:
            sched.create_workers(Job(role="picky", replicas=1, tasks=[spec]))
        assert sched.roles == []
    finally:
        sched.close()
    assert backend.leftovers(sched.experiment_name, sched.trial_name) == []
    return str(info.value)


def test_unknown_slurm_names_are_refused_with_the_clusters_values(backend):
    if backend.name != "slurm":
        pytest.skip(f"partitions, features and reservations are Slurm's ({backend.name})")
    text = _refused(backend, SchedulingSpec(reservation="no-such-resv"))
    assert "no-such-resv" in text and "reservations: none" in text, text
    text = _refused(backend, SchedulingSpec(partition="no-such-part"))
    assert "no-such-part" in text and "debug" in text, text  # the lab's partition
    text = _refused(backend, SchedulingSpec(constraint="b200&ib"))
    assert "b200, ib" in text and "node features in sinfo: none" in text, text


def test_a_known_slurm_partition_runs_the_role(sched, backend):
    if backend.name != "slurm":
        pytest.skip(f"partitions are Slurm's ({backend.name})")
    from corral.backends.slurm.job_files import JobFiles

    (wid,) = sched.create_workers(
        Job(role="p", replicas=1, tasks=[SchedulingSpec(partition="debug", exclusive=True)])
    )
    with open(JobFiles(sched.paths.log_dir).batch_script("p")) as fh:
        script = fh.read()
    assert "#SBATCH --partition=debug\n" in script and "#SBATCH --exclusive\n" in script
    assert sched.health(wid)["status"] == "ok"


def test_unknown_ray_resources_are_refused_with_the_clusters_values(backend):
    if backend.name != "ray":
        pytest.skip(f"custom resources and accelerator types are Ray's ({backend.name})")
    text = _refused(backend, SchedulingSpec(accelerator_type="B200"))
    assert "accelerator_type:B200" in text and "FAKE_A100, FAKE_H100" in text, text
    text = _refused(backend, SchedulingSpec(ray_resources={"tpu_slice": 1}))
    assert "tpu_slice" in text and "rollout_slot" in text, text


def test_ray_accelerator_type_and_custom_resources_pick_the_node(sched, backend):
    if backend.name != "ray":
        pytest.skip(f"custom resources and accelerator types are Ray's ({backend.name})")
    import ray

    from tests.conformance.backend_ray import CUSTOM_RESOURCE, NODE_ACCELERATORS

    def node_with(resource: str) -> str:
        (node,) = [n["NodeID"] for n in ray.nodes() if n["Alive"] and resource in n["Resources"]]
        return node

    sched.create_workers(
        Job(
            role="b",
            replicas=2,
            tasks=[SchedulingSpec(gpu=1, accelerator_type=NODE_ACCELERATORS[1])],
        )
    )
    sched.create_workers(
        Job(role="s", replicas=2, tasks=[SchedulingSpec(ray_resources={CUSTOM_RESOURCE[0]: 2})])
    )
    h100 = node_with(f"accelerator_type:{NODE_ACCELERATORS[1]}")
    slots = node_with(CUSTOM_RESOURCE[0])
    assert {sched.launcher.placement("b", i)["node_id"] for i in range(2)} == {h100}
    assert {sched.launcher.placement("s", i)["node_id"] for i in range(2)} == {slots}
    assert ray.available_resources().get(CUSTOM_RESOURCE[0], 0) == 0  # 2 x 2 of 4 held
