"""The backend registry is the one table config, the CLI and ``corral`` read."""

from __future__ import annotations

import sys

import pytest

import corral
from corral import backends
from corral.config import BaseExperimentConfig, make_scheduler
from corral.errors import ConfigError


class FakeScheduler:
    """A registered backend that records how it was made (registry test only)."""

    def __init__(self, exp_config=None, **kwargs):
        self.exp_config = exp_config
        self.kwargs = kwargs


@pytest.fixture
def fake_backend(monkeypatch):
    monkeypatch.setitem(backends.BACKENDS, "fake", f"{__name__}:FakeScheduler")
    return "fake"


def test_every_registered_backend_resolves_to_its_scheduler():
    for name in backends.backend_names():
        cls = backends.scheduler_class(name)
        assert cls.backend == name
        assert getattr(corral, cls.__name__) is cls


def test_config_cli_and_package_read_the_same_table(fake_backend):
    cfg = BaseExperimentConfig()
    cfg.scheduler.type = fake_backend
    made = make_scheduler(cfg, startup_timeout=3)
    assert isinstance(made, FakeScheduler) and made.kwargs == {"startup_timeout": 3}
    assert corral.FakeScheduler is FakeScheduler
    from corral.cli import build_parser

    args = build_parser().parse_args(["demo", "--scheduler", fake_backend])
    assert args.scheduler == fake_backend


def test_unknown_backend_names_the_field_and_the_choices():
    cfg = BaseExperimentConfig()
    cfg.scheduler.type = "kubernetes"
    with pytest.raises(ConfigError) as info:
        make_scheduler(cfg)
    assert "scheduler.type" in str(info.value) and "kubernetes" in str(info.value)
    assert "local, ray, slurm" in str(info.value)


def test_the_registry_imports_no_backend():
    code = (
        "import sys, corral.backends as b, corral.config; b.backend_names(); "
        "print(sorted(m for m in sys.modules if m.startswith('corral.backends.')))"
    )
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    # the config's typed backend options (data only) are loaded; no backend module is
    assert out.stdout.strip() == "['corral.backends.backend_options']"


def _leftovers_of_a(experiment: str, trial: str) -> list[str]:
    return [f"a removed {experiment}/{trial}"]


def _leftovers_of_b(experiment: str, trial: str) -> list[str]:
    return [f"b removed {experiment}/{trial}", "b again"]


def test_corral_stop_asks_every_backend_of_the_leftovers_table(monkeypatch):
    """``corral stop`` names no backend: it asks each entry of TRIAL_LEFTOVERS, in order."""
    monkeypatch.setattr(
        backends,
        "TRIAL_LEFTOVERS",
        {"a": f"{__name__}:_leftovers_of_a", "b": f"{__name__}:_leftovers_of_b"},
    )
    assert backends.stop_trial_leftovers("exp", "t1") == [
        "a removed exp/t1",
        "b removed exp/t1",
        "b again",
    ]


def test_every_leftovers_entry_is_a_registered_backends_function():
    import importlib

    for name, target in backends.TRIAL_LEFTOVERS.items():
        assert name in backends.BACKENDS
        module, _, function = target.partition(":")
        assert callable(getattr(importlib.import_module(module), function))
