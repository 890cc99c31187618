"""Experiment config: YAML files, dotted overrides, partial cluster objects, make_scheduler."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from corral.config import (
    BaseExperimentConfig,
    ClusterSpecConfig,
    NameResolveConfig,
    SchedulerConfig,
    cluster_field,
    load_expr_config,
    make_scheduler,
    scheduler_field,
)
from corral.errors import ConfigError
from corral.safedirs import default_fileroot
from corral.spec import SchedulingSpec, SchedulingStrategy

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from grpo_config import GRPOConfig  # noqa: E402


def write(tmp_path: Path, text: str, name: str = "exp.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


YAML = """
experiment_name: grpo
trial_name: run1
cluster:
  n_nodes: 2
  n_gpus_per_node: 8
  fileroot: /tmp/corral-test
  name_resolve:
    type: nfs
    nfs_record_root: /tmp/corral-test/nr
scheduler:
  type: local
  startup_timeout: 30
rollout:
  n_replicas: 4
scheduling_spec:
  - cpu: 4
    gpu: 1
    mem: 32
    env_vars: {A: "1"}
  - cpu: 2
    gpu: 0
scheduling_strategy:
  type: colocation
  target: actor
"""


def test_yaml_builds_nested_dataclasses(tmp_path: Path) -> None:
    path = write(tmp_path, YAML)
    cfg, used = load_expr_config([path], GRPOConfig)
    assert used == path
    assert isinstance(cfg, GRPOConfig)
    assert cfg.experiment_name == "grpo" and cfg.trial_name == "run1"
    assert isinstance(cfg.cluster, ClusterSpecConfig)
    assert cfg.cluster.n_nodes == 2
    assert isinstance(cfg.cluster.name_resolve, NameResolveConfig)
    assert cfg.cluster.name_resolve.nfs_record_root == "/tmp/corral-test/nr"
    assert isinstance(cfg.scheduler, SchedulerConfig)
    assert cfg.scheduler.startup_timeout == 30.0
    assert isinstance(cfg.scheduler.startup_timeout, float)
    assert cfg.rollout.n_replicas == 4
    assert [type(s) for s in cfg.scheduling_spec] == [SchedulingSpec, SchedulingSpec]
    assert cfg.scheduling_spec[0].gpu == 1 and cfg.scheduling_spec[0].env_vars == {"A": "1"}
    assert cfg.scheduling_spec[1].cpu == 2
    assert isinstance(cfg.scheduling_strategy, SchedulingStrategy)
    assert cfg.scheduling_strategy.target == "actor"


def test_dotted_overrides_win_over_yaml(tmp_path: Path) -> None:
    path = write(tmp_path, YAML)
    cfg, _ = load_expr_config(
        [path, "scheduler.type=ray", "cluster.n_gpus_per_node=4", "rollout.n_replicas=9"],
        GRPOConfig,
    )
    assert cfg.scheduler.type == "ray"
    assert cfg.cluster.n_gpus_per_node == 4
    assert cfg.rollout.n_replicas == 9
    assert cfg.cluster.n_nodes == 2  # untouched keys survive


def test_override_before_the_yaml_file_still_wins(tmp_path: Path) -> None:
    path = write(tmp_path, YAML)
    cfg, _ = load_expr_config(["cluster.n_gpus_per_node=4", path], GRPOConfig)
    assert cfg.cluster.n_gpus_per_node == 4


def test_override_with_a_list_of_spec_dicts() -> None:
    cfg, used = load_expr_config(
        ["scheduling_spec=[{cpu: 3, gpu: 2}, {cpu: 1}]", "scheduling_strategy.fork=true"],
        GRPOConfig,
    )
    assert used is None
    assert [(s.cpu, s.gpu) for s in cfg.scheduling_spec] == [(3, 2), (1, 0)]
    assert all(isinstance(s, SchedulingSpec) for s in cfg.scheduling_spec)
    assert cfg.scheduling_strategy.fork is True


def test_config_flag_form(tmp_path: Path) -> None:
    path = write(tmp_path, YAML)
    for flag in ("--config", "-c"):
        cfg, used = load_expr_config([flag, path, "trial_name=t9"], GRPOConfig)
        assert used == path
        assert cfg.experiment_name == "grpo"
        assert cfg.trial_name == "t9"


def test_config_flag_without_path() -> None:
    with pytest.raises(ConfigError) as info:
        load_expr_config(["--config"], BaseExperimentConfig)
    assert info.value.field == "--config"
    assert "YAML" in info.value.fix


def test_no_arguments_gives_defaults() -> None:
    cfg, used = load_expr_config([], BaseExperimentConfig)
    assert used is None
    assert cfg == BaseExperimentConfig()


def test_two_yaml_files_merge(tmp_path: Path) -> None:
    a = write(tmp_path, "cluster: {n_nodes: 3, n_gpus_per_node: 2}\n", "a.yaml")
    b = write(tmp_path, "cluster: {n_gpus_per_node: 6}\n", "b.yml")
    cfg, used = load_expr_config([a, b], BaseExperimentConfig)
    assert cfg.cluster.n_nodes == 3 and cfg.cluster.n_gpus_per_node == 6
    assert used == b


def test_unknown_top_level_field(tmp_path: Path) -> None:
    path = write(tmp_path, "experiment_nmae: oops\n")
    with pytest.raises(ConfigError) as info:
        load_expr_config([path], BaseExperimentConfig)
    exc = info.value
    assert exc.field == "BaseExperimentConfig.experiment_nmae"
    assert exc.value == "oops"
    assert "experiment_name" in exc.fix


def test_unknown_nested_field_by_override() -> None:
    with pytest.raises(ConfigError) as info:
        load_expr_config(["cluster.n_gpu_per_node=4"], BaseExperimentConfig)
    exc = info.value
    assert exc.field == "BaseExperimentConfig.cluster.n_gpu_per_node"
    assert "n_gpus_per_node" in exc.fix


def test_unknown_field_inside_list_of_specs() -> None:
    with pytest.raises(ConfigError) as info:
        load_expr_config(["scheduling_spec=[{cpu: 1, gpus: 2}]"], GRPOConfig)
    assert info.value.field == "GRPOConfig.scheduling_spec[0].gpus"
    assert "'gpu'" in info.value.fix


@pytest.mark.parametrize(
    "override,field_name",
    [
        ("cluster.n_gpus_per_node=eight", "BaseExperimentConfig.cluster.n_gpus_per_node"),
        ("scheduler.startup_timeout=soon", "BaseExperimentConfig.scheduler.startup_timeout"),
        ("experiment_name=[1, 2]", "BaseExperimentConfig.experiment_name"),
        ("cluster.n_nodes=1.5", "BaseExperimentConfig.cluster.n_nodes"),
    ],
)
def test_wrong_type_is_refused(override: str, field_name: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_expr_config([override], BaseExperimentConfig)
    assert info.value.field == field_name
    assert "use a" in info.value.fix


@pytest.mark.parametrize("override", ["scheduler=ray", "cluster=8", "cluster.name_resolve=nfs"])
def test_scalar_for_a_section_is_refused(override: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_expr_config([override], BaseExperimentConfig)
    assert override.partition("=")[0] in info.value.field


def test_wrong_type_in_spec_list_names_spec_field() -> None:
    with pytest.raises(ConfigError) as info:
        load_expr_config(["scheduling_spec=[{cpu: -1}]"], GRPOConfig)
    assert "cpu" in info.value.field
    assert info.value.value == -1


def test_override_below_a_scalar_is_refused() -> None:
    with pytest.raises(ConfigError) as info:
        load_expr_config(["experiment_name=x", "experiment_name.sub=1"], BaseExperimentConfig)
    assert "experiment_name" in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.yaml")
    for argv in ([missing], ["--config", missing]):
        with pytest.raises(ConfigError) as info:
            load_expr_config(argv, BaseExperimentConfig)
        assert info.value.value == missing
        assert "does not exist" in info.value.fix


def test_yaml_top_level_not_a_mapping(tmp_path: Path) -> None:
    path = write(tmp_path, "- a\n- b\n")
    with pytest.raises(ConfigError) as info:
        load_expr_config([path], BaseExperimentConfig)
    assert "mapping" in info.value.fix


def test_argument_that_is_neither_file_nor_override() -> None:
    with pytest.raises(ConfigError) as info:
        load_expr_config(["--verbose"], BaseExperimentConfig)
    assert info.value.value == "--verbose"
    assert "a.b=1" in info.value.fix


def test_empty_yaml_gives_defaults(tmp_path: Path) -> None:
    cfg, _ = load_expr_config([write(tmp_path, "")], BaseExperimentConfig)
    assert cfg == BaseExperimentConfig()


# ---------------------------------------------------------------- partial cluster objects


def test_cluster_missing_fields_get_defaults() -> None:
    cfg = type("Cfg", (), {"cluster": type("C", (), {"n_gpus_per_node": 4})})()
    assert cluster_field(cfg, "n_gpus_per_node") == 4
    defaults = ClusterSpecConfig()
    assert cluster_field(cfg, "fileroot") == defaults.fileroot
    assert cluster_field(cfg, "n_nodes") == defaults.n_nodes
    assert cluster_field(cfg, "name_resolve") == NameResolveConfig()
    assert cluster_field(cfg, "gpu_devices") is None


def test_no_cluster_or_no_config_at_all() -> None:
    assert cluster_field(None, "n_gpus_per_node") == 8
    assert cluster_field(type("Cfg", (), {})(), "fileroot") == default_fileroot()
    assert scheduler_field(None, "type") == "local"
    assert scheduler_field(type("Cfg", (), {"scheduler": object()})(), "startup_timeout") == 120.0


def test_cluster_field_none_means_default() -> None:
    cfg = type("Cfg", (), {"cluster": type("C", (), {"n_gpus_per_node": None})})()
    assert cluster_field(cfg, "n_gpus_per_node") == 8


def test_scheduler_reads_partial_cluster(tmp_path: Path) -> None:
    from corral.backends.local import LocalScheduler

    cfg = type(
        "Cfg",
        (),
        {
            "experiment_name": "partial",
            "trial_name": "t",
            "cluster": type("C", (), {"n_gpus_per_node": 4, "fileroot": str(tmp_path)}),
        },
    )()
    sched = LocalScheduler(exp_config=cfg, gpu_devices=[])
    try:
        assert sched.n_gpus_per_node == 4
        assert sched.fileroot == str(tmp_path)
        assert sched.startup_timeout == SchedulerConfig().startup_timeout
    finally:
        sched.close()


# ---------------------------------------------------------------- make_scheduler


@dataclass
class _Sched:
    type: str = "kubernetes"


@dataclass
class _Cfg:
    scheduler: _Sched = field(default_factory=_Sched)


@pytest.mark.parametrize("kind", ["kubernetes", "LOCAL", "", "slurm "])
def test_make_scheduler_unknown_type(kind: str) -> None:
    cfg = _Cfg(_Sched(kind))
    with pytest.raises(ConfigError) as info:
        make_scheduler(cfg)
    assert info.value.field == "scheduler.type"
    assert info.value.value == kind
    assert "local, ray, slurm" in info.value.fix


def test_make_scheduler_local(tmp_path: Path) -> None:
    cfg, _ = load_expr_config(
        [f"cluster.fileroot={tmp_path}", "experiment_name=mk", "cluster.gpu_devices=[0]"],
        BaseExperimentConfig,
    )
    sched = make_scheduler(cfg)
    try:
        assert type(sched).__name__ == "LocalScheduler"
        assert sched.launcher.devices == [0]
        assert sched.experiment_name == "mk"
    finally:
        sched.close()
