"""Every invalid job or spec raises ConfigError naming the field, the value and a fix,
before any process starts."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import psutil
import pytest

from corral.backends.local import LocalScheduler
from corral.config import BaseExperimentConfig
from corral.errors import ConfigError, WorkerCreationError, WorkerNotFoundError
from corral.spec import (
    Job,
    SchedulingSpec,
    SchedulingStrategy,
    normalize_job,
    validate_role_name,
)


def assert_config_error(exc: ConfigError, field_name: str, value: object) -> None:
    """The error names the field, shows the value and says what to do."""
    assert isinstance(exc, ConfigError)
    assert exc.field == field_name
    text = str(exc)
    assert field_name in text
    assert repr(value) in text, f"{value!r} missing from {text!r}"
    assert exc.fix and exc.fix in text
    assert len(exc.fix) > 10


# ---------------------------------------------------------------- resource counts

BAD_COUNTS = [-1, -100, 1.5, 2.0, "4", None, True, False, [1]]


@pytest.mark.parametrize("name", ["cpu", "gpu", "mem", "port_count"])
@pytest.mark.parametrize("value", BAD_COUNTS, ids=repr)
def test_bad_resource_count_is_refused(name: str, value: object) -> None:
    with pytest.raises(ConfigError) as info:
        SchedulingSpec(**{name: value})
    assert_config_error(info.value, f"SchedulingSpec.{name}", value)
    assert "whole number" in info.value.fix


@pytest.mark.parametrize("name", ["cpu", "gpu", "mem", "port_count"])
def test_zero_and_positive_counts_are_accepted(name: str) -> None:
    assert getattr(SchedulingSpec(**{name: 0}), name) == 0
    assert getattr(SchedulingSpec(**{name: 7}), name) == 7


def test_bad_count_inside_job_tasks_names_task_index() -> None:
    spec = SchedulingSpec()
    spec.gpu = -2  # mutated after construction: normalize_job re-validates
    job = Job(role="actor", replicas=2, tasks=[SchedulingSpec(), spec])
    with pytest.raises(ConfigError) as info:
        normalize_job(job)
    assert_config_error(info.value, "job.tasks[1].gpu", -2)


@pytest.mark.parametrize("value", [0, -1, 1.0, True, "2"], ids=repr)
def test_bad_replicas(value: object) -> None:
    with pytest.raises(ConfigError) as info:
        normalize_job(Job(role="actor", replicas=value))
    assert_config_error(info.value, "job.replicas", value)


# ---------------------------------------------------------------- strategies


def test_unknown_strategy_type() -> None:
    with pytest.raises(ConfigError) as info:
        SchedulingStrategy(type="spread")
    assert_config_error(info.value, "scheduling_strategy.type", "spread")
    assert "separation" in info.value.fix and "colocation" in info.value.fix


@pytest.mark.parametrize("target", [None, ""])
def test_colocation_without_target_is_refused_by_the_job_check(target: object) -> None:
    strategy = SchedulingStrategy(type="colocation", target=target)  # accepted, as in AReaL
    with pytest.raises(ConfigError) as info:
        normalize_job(Job(role="ref", replicas=1, scheduling_strategy=strategy))
    assert_config_error(info.value, "scheduling_strategy.target", target)
    assert "target=" in info.value.fix
    assert isinstance(info.value, WorkerCreationError | WorkerNotFoundError)


def test_colocation_with_bad_target_name() -> None:
    with pytest.raises(ConfigError) as info:
        SchedulingStrategy(type="colocation", target="../actor")
    assert_config_error(info.value, "scheduling_strategy.target", "../actor")


def test_strategy_as_dict_with_unknown_type_is_refused() -> None:
    job = Job.__new__(Job)
    job.role, job.replicas, job.tasks = "actor", 1, [SchedulingSpec()]
    job.scheduling_strategy = {"type": "nearby"}
    with pytest.raises(ConfigError) as info:
        normalize_job(job)
    assert_config_error(info.value, "scheduling_strategy.type", "nearby")


def test_colocation_with_itself_is_refused() -> None:
    job = Job(
        role="actor",
        replicas=1,
        scheduling_strategy=SchedulingStrategy(type="colocation", target="actor"),
    )
    with pytest.raises(ConfigError) as info:
        normalize_job(job)
    assert_config_error(info.value, "scheduling_strategy.target", "actor")


# ---------------------------------------------------------------- tasks length


@pytest.mark.parametrize("n_tasks,replicas", [(2, 3), (3, 2), (2, 1), (4, 8)])
def test_tasks_length_neither_one_nor_replicas(n_tasks: int, replicas: int) -> None:
    job = Job(role="actor", replicas=replicas, tasks=[SchedulingSpec()] * n_tasks)
    with pytest.raises(ConfigError) as info:
        normalize_job(job)
    assert_config_error(info.value, "job.tasks", f"{n_tasks} specs")
    assert f"replicas={replicas}" in info.value.fix


def test_empty_tasks_list_is_refused() -> None:
    with pytest.raises(ConfigError) as info:
        normalize_job(Job(role="actor", replicas=2, tasks=[]))
    assert info.value.field == "job.tasks"


def test_one_task_is_used_for_every_replica() -> None:
    spec = SchedulingSpec(gpu=1)
    nj = normalize_job(Job(role="actor", replicas=3, tasks=[spec]))
    assert nj.tasks == (spec, spec, spec)
    assert nj.total_gpus == 3


def test_one_task_per_replica_is_kept_in_order() -> None:
    specs = [SchedulingSpec(cpu=i) for i in range(3)]
    nj = normalize_job(Job(role="actor", replicas=3, tasks=specs))
    assert [t.cpu for t in nj.tasks] == [0, 1, 2]


# ---------------------------------------------------------------- role names

BAD_ROLES = [
    "a/b",
    "/abs",
    "a:b",
    "..",
    "a..b",
    "../etc",
    "a b",
    " actor",
    "actor\n",
    "",
    "x" * 65,
    "_hidden",
    ".dot",
    "-dash",
    "a\x00b",
    "a\\b",
    None,
    3,
    b"actor",
]


@pytest.mark.parametrize("role", BAD_ROLES, ids=repr)
def test_bad_role_name_is_refused(role: object) -> None:
    with pytest.raises(ConfigError) as info:
        normalize_job(Job(role=role, replicas=1))  # type: ignore[arg-type]
    assert_config_error(info.value, "job.role", role)
    assert "'/'" in info.value.fix and "'..'" in info.value.fix


@pytest.mark.parametrize("role", ["actor", "a", "x" * 64, "ref-model_2.v1", "0rollout"])
def test_good_role_names(role: str) -> None:
    assert validate_role_name(role) == role
    assert normalize_job(Job(role=role, replicas=1)).role == role


# ---------------------------------------------------------------- containers, env, engines


def test_unknown_container_type() -> None:
    with pytest.raises(ConfigError) as info:
        SchedulingSpec(container_type="docker")
    assert_config_error(info.value, "SchedulingSpec.container_type", "docker")
    assert "apptainer" in info.value.fix


@pytest.mark.parametrize("image", [None, ""])
def test_apptainer_without_image(image: object) -> None:
    with pytest.raises(ConfigError) as info:
        SchedulingSpec(container_type="apptainer", image=image)
    assert_config_error(info.value, "SchedulingSpec.image", image)
    assert ".sif" in info.value.fix


def test_apptainer_with_image_is_accepted() -> None:
    spec = SchedulingSpec(container_type="apptainer", image="/images/train.sif")
    assert spec.image == "/images/train.sif"


def test_unknown_ray_placement_strategy() -> None:
    with pytest.raises(ConfigError) as info:
        SchedulingSpec(ray_placement_strategy="pack")
    assert_config_error(info.value, "SchedulingSpec.ray_placement_strategy", "pack")


@pytest.mark.parametrize(
    "env",
    [{"A": 1}, {1: "a"}, {"A": None}, ["A=1"], "A=1", {"A": b"1"}],
    ids=repr,
)
def test_bad_env_vars(env: object) -> None:
    with pytest.raises(ConfigError) as info:
        SchedulingSpec(env_vars=env)  # type: ignore[arg-type]
    assert_config_error(info.value, "SchedulingSpec.env_vars", env)
    assert "str to str" in info.value.fix


@pytest.mark.parametrize("engines", [{"e": 1}, ["corral.X"], {"e": None}], ids=repr)
def test_bad_engines(engines: object) -> None:
    with pytest.raises(ConfigError) as info:
        SchedulingSpec(engines=engines)  # type: ignore[arg-type]
    assert_config_error(info.value, "SchedulingSpec.engines", engines)


def test_dict_task_with_unknown_field() -> None:
    job = type("J", (), {})()
    job.role, job.replicas, job.scheduling_strategy = "actor", 1, None
    job.tasks = [{"cpu": 2, "gpus": 1}]
    with pytest.raises(ConfigError) as info:
        normalize_job(job)
    exc = info.value
    assert exc.field == "job.tasks[0]"
    assert "gpus" in str(exc)
    assert "unknown field" in exc.fix


def test_dict_task_with_bad_value_is_refused() -> None:
    job = type("J", (), {"role": "actor", "replicas": 1, "tasks": [{"cpu": -1}]})()
    with pytest.raises(ConfigError) as info:
        normalize_job(job)
    assert "cpu" in info.value.field
    assert "-1" in str(info.value)


@pytest.mark.parametrize("task", [42, "cpu=1", object()], ids=repr)
def test_task_of_wrong_type(task: object) -> None:
    job = type("J", (), {"role": "actor", "replicas": 1, "tasks": [task]})()
    with pytest.raises(ConfigError) as info:
        normalize_job(job)
    assert info.value.field == "job.tasks[0]"
    assert "SchedulingSpec" in info.value.fix


# ---------------------------------------------------------------- job objects


@pytest.mark.parametrize("missing", ["role", "replicas"])
def test_job_object_missing_attribute(missing: str) -> None:
    attrs = {"role": "actor", "replicas": 1, "tasks": [SchedulingSpec()]}
    attrs["scheduling_strategy"] = SchedulingStrategy()
    del attrs[missing]
    job = type("J", (), attrs)()
    with pytest.raises(ConfigError) as info:
        normalize_job(job)
    assert info.value.field == f"job.{missing}"
    assert "role, replicas, tasks and scheduling_strategy" in info.value.fix


def test_plain_object_is_refused_naming_role() -> None:
    with pytest.raises(ConfigError) as info:
        normalize_job(object())
    assert info.value.field == "job.role"


def test_normalize_accepts_any_object_with_the_four_attributes() -> None:
    job = type(
        "Job",
        (),
        {
            "role": "rollout",
            "replicas": 2,
            "tasks": [SchedulingSpec(cpu=2, gpu=1), SchedulingSpec(cpu=3, gpu=1)],
            "scheduling_strategy": SchedulingStrategy(type="separation"),
        },
    )()
    nj = normalize_job(job)
    assert nj.role == "rollout"
    assert nj.replicas == 2
    assert [t.cpu for t in nj.tasks] == [2, 3]
    assert nj.total_gpus == 2
    assert nj.strategy.type == "separation"
    assert not nj.is_colocated


def test_normalize_accepts_a_single_spec_instead_of_a_list() -> None:
    spec = SchedulingSpec(cpu=4)
    job = type("J", (), {"role": "a", "replicas": 3, "tasks": spec, "scheduling_strategy": None})()
    nj = normalize_job(job)
    assert nj.tasks == (spec, spec, spec)


def test_normalize_accepts_dict_tasks() -> None:
    job = type(
        "J",
        (),
        {
            "role": "a",
            "replicas": 2,
            "tasks": [{"cpu": 2, "gpu": 1, "env_vars": {"X": "1"}}, {"cpu": 3}],
            "scheduling_strategy": None,
        },
    )()
    nj = normalize_job(job)
    assert all(isinstance(t, SchedulingSpec) for t in nj.tasks)
    assert nj.tasks[0].gpu == 1 and nj.tasks[0].env_vars == {"X": "1"}
    assert nj.tasks[1].cpu == 3 and nj.tasks[1].gpu == 0


def test_normalize_accepts_a_single_dict_task() -> None:
    job = type("J", (), {"role": "a", "replicas": 2, "tasks": {"mem": 9}})()
    nj = normalize_job(job)
    assert [t.mem for t in nj.tasks] == [9, 9]


def test_normalize_accepts_strategy_as_dict() -> None:
    job = type(
        "J",
        (),
        {
            "role": "ref",
            "replicas": 1,
            "tasks": [SchedulingSpec()],
            "scheduling_strategy": {"type": "colocation", "target": "actor", "fork": True},
        },
    )()
    nj = normalize_job(job)
    assert isinstance(nj.strategy, SchedulingStrategy)
    assert nj.is_colocated and nj.strategy.target == "actor" and nj.strategy.fork


def test_normalize_accepts_strategy_as_foreign_object() -> None:
    strat = type("S", (), {"type": "colocation", "target": "actor"})()
    job = type("J", (), {"role": "ref", "replicas": 1, "scheduling_strategy": strat})()
    nj = normalize_job(job)
    assert nj.strategy.type == "colocation" and nj.strategy.target == "actor"
    assert nj.strategy.fork is True  # AReaL's default


def test_normalize_accepts_a_foreign_dataclass_task() -> None:
    @dataclass
    class MySpec:
        cpu: int = 5
        gpu: int = 0
        env_vars: dict = field(default_factory=dict)

    job = type("J", (), {"role": "a", "replicas": 1, "tasks": [MySpec()]})()
    assert normalize_job(job).tasks[0].cpu == 5


def test_missing_tasks_and_strategy_get_defaults() -> None:
    job = type("J", (), {"role": "a", "replicas": 2})()
    nj = normalize_job(job)
    assert len(nj.tasks) == 2 and nj.tasks[0] == SchedulingSpec()
    assert nj.strategy == SchedulingStrategy()


# ---------------------------------------------------------------- scheduler-level checks


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


@pytest.fixture
def scheduler(tmp_path):
    cfg = BaseExperimentConfig(experiment_name="spec-test", trial_name="t0")
    cfg.cluster.n_gpus_per_node = 2
    before = _children()
    sched = LocalScheduler(exp_config=cfg, fileroot=str(tmp_path / "root"), gpu_devices=[0, 1])
    yield sched
    assert sched.roles == [], "a refused job left a role behind"
    assert _children() - before == set(), "a refused job started a process"
    sched.close()


def test_gpu_over_n_gpus_per_node(scheduler: LocalScheduler) -> None:
    with pytest.raises(ConfigError) as info:
        scheduler.create_workers(Job(role="actor", replicas=1, tasks=[SchedulingSpec(gpu=3)]))
    assert_config_error(info.value, "job.tasks[0].gpu", 3)
    assert "n_gpus_per_node=2" in info.value.fix
    assert scheduler.launcher.pids("actor") == []


def test_gpus_over_free_devices(scheduler: LocalScheduler) -> None:
    with pytest.raises(ConfigError) as info:
        scheduler.create_workers(Job(role="actor", replicas=3, tasks=[SchedulingSpec(gpu=1)]))
    exc = info.value
    assert "actor" in exc.field and exc.value == 3
    assert "only 2 of 2 GPUs are free" in exc.fix
    assert "[0, 1]" in exc.fix
    assert scheduler.launcher.pids("actor") == []


def test_invalid_job_through_scheduler_starts_nothing(scheduler: LocalScheduler) -> None:
    with pytest.raises(ConfigError) as info:
        scheduler.create_workers(Job(role="bad/role", replicas=1))
    assert info.value.field == "job.role"


def test_colocation_with_unknown_target_starts_nothing(scheduler: LocalScheduler) -> None:
    job = Job(
        role="ref",
        replicas=1,
        scheduling_strategy=SchedulingStrategy(type="colocation", target="actor"),
    )
    with pytest.raises(ConfigError) as info:
        scheduler.create_workers(job)
    assert_config_error(info.value, "scheduling_strategy.target", "actor")
    assert "create that role first" in info.value.fix


def test_fork_workers_from_unknown_role(scheduler: LocalScheduler) -> None:
    from corral.errors import WorkerNotFoundError

    with pytest.raises(WorkerNotFoundError, match="actor"):
        scheduler.fork_workers("ref", "actor")
    with pytest.raises(ConfigError):
        scheduler.fork_workers("../ref", "actor")


@pytest.mark.parametrize("devices", [[0, 0], [1, 2, 1]])
def test_duplicate_gpu_devices(tmp_path, devices: list[int]) -> None:
    before = _children()
    with pytest.raises(ConfigError) as info:
        LocalScheduler(fileroot=str(tmp_path), gpu_devices=devices)
    assert_config_error(info.value, "gpu_devices", devices)
    assert "distinct" in info.value.fix
    assert _children() - before == set()


@pytest.mark.parametrize("devices", [[-1], ["0"], [0.5]], ids=repr)
def test_bad_gpu_device_values(tmp_path, devices: list) -> None:
    with pytest.raises(ConfigError) as info:
        LocalScheduler(fileroot=str(tmp_path), gpu_devices=devices)
    assert info.value.field == "gpu_devices"


def test_fileroot_under_a_file(tmp_path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    bad = str(blocker / "root")
    with pytest.raises(ConfigError) as info:
        LocalScheduler(fileroot=bad, gpu_devices=[0, 1])
    assert_config_error(info.value, "cluster.fileroot", bad)
    assert "writable directory" in info.value.fix
    assert not os.path.exists(bad)


def test_negative_n_gpus_per_node(tmp_path) -> None:
    with pytest.raises(ConfigError) as info:
        LocalScheduler(fileroot=str(tmp_path), gpu_devices=[], n_gpus_per_node=-1)
    assert_config_error(info.value, "n_gpus_per_node", -1)


@pytest.mark.parametrize("field_name", ["experiment_name", "trial_name"])
def test_bad_experiment_or_trial_name(tmp_path, field_name: str) -> None:
    cfg = BaseExperimentConfig()
    setattr(cfg, field_name, "../escape")
    with pytest.raises(ConfigError) as info:
        LocalScheduler(exp_config=cfg, fileroot=str(tmp_path), gpu_devices=[])
    assert_config_error(info.value, field_name, "../escape")
    assert not (tmp_path / "secrets").exists()


@pytest.mark.parametrize("value", ["soon", "0", "-3", "inf", "nan", ""])
def test_bad_stop_deadline_in_env_vars_is_refused_before_anything_starts(
    scheduler: LocalScheduler, value: str
) -> None:
    """A worker can only fall back to 5 s on a bad value; the controller refuses it first."""
    with pytest.raises(ConfigError) as info:
        spec = SchedulingSpec(env_vars={"CORRAL_STOP_DEADLINE": value})
        scheduler.create_workers(Job(role="actor", replicas=1, tasks=[spec]))
    assert_config_error(info.value, "SchedulingSpec.env_vars['CORRAL_STOP_DEADLINE']", value)
    assert "seconds > 0" in info.value.fix
    assert scheduler.launcher.pids("actor") == []


def test_bad_stop_deadline_in_the_environment_is_refused_before_anything_starts(
    scheduler: LocalScheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CORRAL_STOP_DEADLINE", "5s")
    with pytest.raises(ConfigError) as info:
        scheduler.create_workers(Job(role="actor", replicas=1))
    assert_config_error(info.value, "environment variable CORRAL_STOP_DEADLINE", "5s")
    assert scheduler.launcher.pids("actor") == []


def test_a_good_stop_deadline_is_accepted() -> None:
    normalize_job(
        Job(role="a", replicas=1, tasks=[SchedulingSpec(env_vars={"CORRAL_STOP_DEADLINE": "2.5"})])
    )
