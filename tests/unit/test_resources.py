"""Heterogeneous resources (corral.resources, backends/slurm/resource_names.py): the spec's
fields, what they become for each backend, and unknown names refused with the cluster's."""

from __future__ import annotations

import subprocess
import warnings

import pytest

from corral.backends.slurm.resource_names import SlurmResources, read_resources, resource_problem
from corral.errors import ConfigError
from corral.resources import (
    constraint_features,
    ray_extra_resources,
    slurm_directives,
    unknown_ray_resources,
)
from corral.spec import SchedulingSpec


def test_areal_main_fields_exist_with_its_defaults():
    spec = SchedulingSpec()
    assert spec.reservation is None and spec.exclusive is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert SchedulingSpec(ray_placement_strategy=None).ray_placement_strategy == "separate"


@pytest.mark.parametrize(
    "field, value",
    [
        ("reservation", "two words"),
        ("partition", ""),
        ("constraint", 5),
        ("exclusive", "yes"),
        ("accelerator_type", "A 100"),
        ("ray_resources", {"GPU": 1}),
        ("ray_resources", {"slot": 0}),
        ("ray_resources", {"accelerator_type:A100": 1}),
        ("ray_resources", ["slot"]),
    ],
)
def test_malformed_fields_name_the_field(field, value):
    with pytest.raises(ConfigError) as info:
        SchedulingSpec(**{field: value})
    assert info.value.field.startswith(f"SchedulingSpec.{field}")


def test_ray_bundle_extras_and_slurm_directives():
    spec = SchedulingSpec(ray_resources={"slot": 2}, accelerator_type="A100")
    assert ray_extra_resources(spec) == {"slot": 2.0, "accelerator_type:A100": 0.001}
    spec = SchedulingSpec(partition="gpu", constraint="h100&ib", reservation="rl", exclusive=True)
    assert slurm_directives(spec, "cpu") == [
        "--partition=gpu", "--constraint=h100&ib", "--reservation=rl", "--exclusive"
    ]  # fmt: skip
    assert slurm_directives(SchedulingSpec(), "cpu") == ["--partition=cpu"]
    assert constraint_features("[a100*2&ib]|h100") == ["a100", "ib", "h100"]


def test_unknown_ray_resources_list_what_the_cluster_has():
    cluster = {"CPU": 8, "GPU": 8, "accelerator_type:A100": 1, "slot": 4, "node:1.2.3.4": 1}
    assert unknown_ray_resources({"slot", "accelerator_type:A100"}, cluster) is None
    why = unknown_ray_resources({"accelerator_type:B200"}, cluster)
    assert "accelerator_type:B200" in why and "accelerator types: A100" in why
    assert "custom resources: slot" in why and "node:" not in why


def test_unknown_slurm_names_list_what_the_cluster_has():
    found = SlurmResources(["debug", "gpu"], {"h100"}, ["rl"])
    assert resource_problem(found, "gpu", "h100", "rl") is None
    field, value, why = resource_problem(found, "big", None, None)
    assert (field, value) == ("partition", "big") and "debug, gpu" in why
    field, _, why = resource_problem(found, None, "h100&b200", None)
    assert field == "constraint" and "b200" in why and "h100" in why
    empty = SlurmResources(["debug"], set(), [], "No reservations in the system")
    field, _, why = resource_problem(empty, None, None, "rl")
    assert "reservations: none" in why and "No reservations in the system" in why


def test_read_resources_parses_sinfo_and_scontrol():
    def run(argv, timeout):
        if argv[0] == "sinfo":
            out = "n1|debug*|h100,ib\nn2|gpu|(null)\n"
        else:
            out = "ReservationName=rl StartTime=now Nodes=n1\n"
        return subprocess.CompletedProcess(argv, 0, out, "")

    found = read_resources(run)
    assert found.partitions == ["debug", "gpu"] and found.features == {"h100", "ib"}
    assert found.reservations == ["rl"]


def _dry(backend: str, tmp_path):
    from corral.backends import scheduler_class
    from corral.config import BaseExperimentConfig

    cfg = BaseExperimentConfig(experiment_name="dr", trial_name="t1")
    cfg.cluster.fileroot = str(tmp_path)
    cfg.cluster.n_gpus_per_node = 8
    return scheduler_class(backend)(exp_config=cfg, dry_run=True)


def test_dry_runs_show_the_resources(tmp_path):
    from corral.spec import Job

    spec = SchedulingSpec(
        gpu=2, partition="b200", constraint="ib", reservation="rl", exclusive=True,
        ray_resources={"slot": 1}, accelerator_type="B200",
    )  # fmt: skip
    job = Job(role="actor", replicas=2, tasks=[spec])
    slurm = _dry("slurm", tmp_path)
    text = slurm.dry_run(job)
    for line in ("--partition=b200", "--constraint=ib", "--reservation=rl", "--exclusive"):
        assert f"#SBATCH {line}\n" in text, text
    ray = _dry("ray", tmp_path)
    text = ray.dry_run(job)
    assert "'slot': 1.0" in text and "'accelerator_type:B200': 0.001" in text, text


def test_a_spec_of_areal_main_converts_with_its_new_fields():
    import dataclasses

    from corral.spec import Job, normalize_job

    @dataclasses.dataclass
    class MainSpec:  # AReaL main's SchedulingSpec, the fields this test needs
        cpu: int = 8
        gpu: int = 2
        mem: int = 32
        reservation: str | None = "rl-week"
        exclusive: bool = True
        ray_placement_strategy: str | None = None

    (spec,) = normalize_job(Job(role="actor", replicas=1, tasks=[MainSpec()])).tasks
    assert (spec.reservation, spec.exclusive, spec.ray_placement_strategy) == (
        "rl-week",
        True,
        "separate",
    )
