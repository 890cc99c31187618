"""The backend registry is the one table config, the CLI and ``corral`` read."""

from __future__ import annotations

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
