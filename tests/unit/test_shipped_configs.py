"""Every config file under examples/ loads and dry-runs; AReaL-shaped files with
sections corral does not own are accepted (kept in ``cfg.extra``), while a typo in a
field corral owns is still an error naming the field and the fix."""

from __future__ import annotations

import glob
import os

import pytest

from corral import BaseExperimentConfig, load_expr_config
from corral.cli import main
from corral.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHIPPED = sorted(
    glob.glob(os.path.join(ROOT, "examples", "**", "*.yaml"), recursive=True)
    + glob.glob(os.path.join(ROOT, "examples", "**", "*.yml"), recursive=True)
)

AREAL_SHAPED = """\
experiment_name: gsm8k-grpo
trial_name: trial0
seed: 1
allocation_mode: sglang:d2+fsdp:d2
total_train_epochs: 10
tokenizer_path: /models/tiny
cluster:
  n_nodes: 1
  n_gpus_per_node: 4
  fileroot: {fileroot}
  name_resolve:
    type: nfs
    ray_actor_name: name_resolve
scheduler:
  type: local
  endpoint: http://localhost:8081
  deploy_mode: separation
  reward_model_path: ''
actor:
  path: /models/tiny
  optimizer:
    lr: 1.0e-6
rollout:
  max_concurrent_rollouts: 16
gconfig:
  n_samples: 4
  max_new_tokens: 64
train_dataset:
  path: openai/gsm8k
  batch_size: 8
"""


def test_examples_ship_at_least_one_config():
    assert SHIPPED, "no config under examples/"


@pytest.mark.parametrize("path", SHIPPED, ids=[os.path.relpath(p, ROOT) for p in SHIPPED])
def test_every_shipped_config_loads_and_dry_runs(path, tmp_path, capsys):
    cfg, used = load_expr_config([path, f"cluster.fileroot={tmp_path}"], BaseExperimentConfig)
    assert used == path and cfg.experiment_name
    code = main(["run", path, f"cluster.fileroot={tmp_path}", "--dry-run"])
    out = capsys.readouterr().out
    assert code == 0 and "# dry run" in out, out


def _write(tmp_path, text: str) -> str:
    path = tmp_path / "areal.yaml"
    path.write_text(text.format(fileroot=tmp_path))
    return str(path)


def test_an_areal_shaped_config_keeps_unowned_sections_for_the_user(tmp_path):
    cfg, _ = load_expr_config([_write(tmp_path, AREAL_SHAPED)], BaseExperimentConfig)
    assert cfg.scheduler.type == "local" and cfg.cluster.n_gpus_per_node == 4
    assert cfg.cluster.fileroot == str(tmp_path)
    assert cfg.extra["rollout"] == {"max_concurrent_rollouts": 16}
    assert cfg.extra["seed"] == 1 and cfg.extra["actor"]["optimizer"]["lr"] == 1e-6
    assert set(cfg.extra) == {
        "seed", "allocation_mode", "total_train_epochs", "tokenizer_path", "actor",
        "rollout", "gconfig", "train_dataset",
    }  # fmt: skip


def test_dry_run_of_an_areal_shaped_config_says_what_it_ignores(tmp_path, capsys):
    assert main(["run", _write(tmp_path, AREAL_SHAPED), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "kept in cfg.extra and ignored: actor, allocation_mode," in out, out


@pytest.mark.parametrize(
    "old,new,field",
    [
        ("  n_gpus_per_node: 4", "  n_gpu_per_node: 4", "cluster.n_gpu_per_node"),
        ("  type: local", "  typo: local", "scheduler.typo"),
        ("    type: nfs", "    tpye: nfs", "name_resolve.tpye"),
        ("trial_name: trial0", "trial_nam: trial0", "BaseExperimentConfig.trial_nam"),
        ("scheduler:", "schedular:", "BaseExperimentConfig.schedular"),
    ],
)
def test_a_typo_in_a_field_corral_owns_is_still_an_error(tmp_path, old, new, field):
    text = AREAL_SHAPED.replace(old, new, 1)
    assert text != AREAL_SHAPED
    with pytest.raises(ConfigError) as err:
        load_expr_config([_write(tmp_path, text)], BaseExperimentConfig)
    assert field in err.value.field, err.value
