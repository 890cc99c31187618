"""RayOptions / SlurmOptions: one typed dataclass per backend, read from keywords, the
config's section or an older flat key, and checked once (field, value, fix)."""

from __future__ import annotations

import pytest

from corral.backends.backend_options import RayOptions, SlurmOptions
from corral.backends.slurm.scheduler import SlurmScheduler
from corral.config import BaseExperimentConfig, load_expr_config
from corral.errors import ConfigError
from corral.spec import Job


def _yaml(tmp_path, text: str) -> str:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return str(path)


def test_config_sections_and_old_flat_keys(tmp_path):
    cfg, _ = load_expr_config(
        [_yaml(tmp_path, "scheduler:\n  partition: gpu\n  ray_address: 'h:6379'\n"),
         "scheduler.slurm.qos=high"],
        BaseExperimentConfig,
    )  # fmt: skip
    assert cfg.scheduler.slurm.partition == "gpu"  # flat key moved into its section
    assert cfg.scheduler.slurm.qos == "high"
    assert cfg.scheduler.ray.address == "h:6379"
    assert RayOptions.resolve(cfg).address == "h:6379"


def test_an_option_set_twice_is_refused(tmp_path):
    text = "scheduler:\n  partition: a\n  slurm:\n    partition: b\n"
    with pytest.raises(ConfigError, match="partition.*keep one"):
        load_expr_config([_yaml(tmp_path, text)], BaseExperimentConfig)


def test_keywords_win_over_the_config_and_srun_args_are_split():
    cfg = BaseExperimentConfig()
    cfg.scheduler.slurm.partition = "from_config"
    cfg.scheduler.slurm.srun_args = "--mpi=pmix --exclusive"
    options = SlurmOptions.resolve(cfg, account="acct")
    assert (options.partition, options.account) == ("from_config", "acct")
    assert options.srun_args == ["--mpi=pmix", "--exclusive"]
    assert SlurmOptions.resolve(cfg, partition="kw").partition == "kw"


def test_objects_with_flat_scheduler_fields_are_read():
    class Sched:
        partition = "flat"

    class Cfg:
        scheduler = Sched()

    assert SlurmOptions.resolve(Cfg()).partition == "flat"


@pytest.mark.parametrize(
    "given, field",
    [
        (dict(time_limit="soon"), "time_limit"),
        (dict(partition="a b"), "partition"),
        (dict(sbatch_directives=["reservation=x"]), "sbatch_directives[0]"),
        (dict(srun_args="--x 'y"), "srun_args"),
        (dict(partitoin="a"), "partitoin"),
    ],
)
def test_bad_slurm_options_name_the_field(given, field):
    with pytest.raises(ConfigError) as info:
        SlurmOptions.resolve(None, **given)
    assert info.value.field == field


def test_ray_options_are_checked():
    with pytest.raises(ConfigError) as info:
        RayOptions.resolve(None, init_kwargs=["num_cpus", 2])
    assert info.value.field == "init_kwargs"


def test_slurm_scheduler_renders_its_options(tmp_path):
    cfg = BaseExperimentConfig(experiment_name="opt", trial_name="t")
    cfg.cluster.fileroot = str(tmp_path)
    cfg.cluster.n_gpus_per_node = 4
    cfg.scheduler.slurm.time_limit = "1:00:00"
    sched = SlurmScheduler(exp_config=cfg, partition="debug", dry_run=True)
    try:
        script = sched.dry_run(Job(role="r", replicas=1))
        assert "#SBATCH --partition=debug" in script and "#SBATCH --time=1:00:00" in script
    finally:
        sched.close()
    with pytest.raises(ConfigError, match="time_limit"):
        SlurmScheduler(exp_config=cfg, time_limit="soon", dry_run=True)
