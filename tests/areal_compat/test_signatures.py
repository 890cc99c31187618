"""Every public method, parameter, default and dataclass field of AReaL 1.0.4's scheduler
API exists in corral with the same name, kind and default, except the deliberate
differences below, each of which docs/areal.md lists (with its reason and the one-line
change) under the same name.
"""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import pytest

import corral
import corral.errors
from corral.backends.local import LocalScheduler
from corral.backends.ray.scheduler import RayScheduler
from corral.backends.slurm.scheduler import SlurmScheduler
from corral.scheduler import Scheduler

DOC = Path(__file__).resolve().parents[2] / "docs" / "areal.md"

#: Defaults that differ on purpose; the key is how docs/areal.md names each one.
DIFFERENT_DEFAULTS = {
    "SchedulingSpec.cpu",
    "SchedulingSpec.mem",
    "SchedulingSpec.image",
    "SchedulingSpec.container_type",
    "SchedulingSpec.mount",
    "SchedulingSpec.srun_additional_args",
    "SchedulingSpec.additional_bash_cmds",
    "SchedulingSpec.ray_placement_strategy",
    "call_engine.http_timeout",
    "call_engine.max_retries",
    "call_engine.retry_delay",
    "async_call_engine.http_timeout",
    "async_call_engine.max_retries",
    "async_call_engine.retry_delay",
    "__init__.startup_timeout",
    "__init__.health_check_interval",
    "__init__.n_gpus_per_node",
    "__init__.name_resolve_type",
    "__init__.nfs_record_root",
    "__init__.etcd3_addr",
    "__init__.container_type",
    "__init__.container_mounts",
    "__init__.srun_additional_args",
}


def _pairs(areal):
    api = areal["areal.api.scheduler_api"]
    return [
        (api.Scheduler, Scheduler),
        (areal["areal.infra.scheduler.local"].LocalScheduler, LocalScheduler),
        (areal["areal.infra.scheduler.ray"].RayScheduler, RayScheduler),
        (areal["areal.infra.scheduler.slurm"].SlurmScheduler, SlurmScheduler),
    ]


def _public_members(cls):
    for name, value in inspect.getmembers(cls):
        if name.startswith("_") and name != "__init__":
            continue
        static = inspect.getattr_static(cls, name)
        if inspect.isfunction(value) or isinstance(static, property):
            yield name, value


def test_scheduler_methods_and_parameters(areal):
    problems = []
    for theirs, ours in _pairs(areal):
        for name, method in _public_members(theirs):
            if not hasattr(ours, name):
                problems.append(f"{ours.__name__}.{name} is missing")
                continue
            if not inspect.isfunction(method):
                continue
            mine = inspect.signature(getattr(ours, name)).parameters
            for pname, param in inspect.signature(method).parameters.items():
                where = f"{ours.__name__}.{name}({pname})"
                got = mine.get(pname)
                if got is None:
                    problems.append(f"{where} is missing")
                elif got.kind != param.kind:
                    problems.append(f"{where}: {got.kind.name}, AReaL {param.kind.name}")
                elif got.default != param.default and f"{name}.{pname}" not in DIFFERENT_DEFAULTS:
                    problems.append(f"{where}: default {got.default!r}, AReaL {param.default!r}")
    assert problems == []


@pytest.mark.parametrize("name", ["Worker", "Job", "SchedulingSpec", "SchedulingStrategy"])
def test_dataclass_fields_and_defaults(areal, name):
    source = (
        areal["areal.api.scheduler_api"]
        if name in ("Worker", "Job")
        else areal["areal.api.cli_args"]
    )
    theirs, ours = getattr(source, name), getattr(corral, name)
    mine = {f.name: f for f in dataclasses.fields(ours)}
    names = [f.name for f in dataclasses.fields(theirs)]
    assert set(names) <= set(mine), set(names) - set(mine)
    if name in ("Worker", "Job"):  # constructed positionally in AReaL code: same order first
        assert [f.name for f in dataclasses.fields(ours)][: len(names)] == names
    for field in dataclasses.fields(theirs):
        if f"{name}.{field.name}" in DIFFERENT_DEFAULTS:
            continue
        assert _default(mine[field.name]) == _default(field), f"{name}.{field.name}"


def _default(field):
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
        if dataclasses.is_dataclass(value):
            return dataclasses.asdict(value)
        return list(value) if isinstance(value, list) else value
    return "required"


def test_strategy_type_enum(areal):
    theirs = areal["areal.api.cli_args"].SchedulingStrategyType
    assert {m.name: m.value for m in theirs} == {
        m.name: m.value for m in corral.SchedulingStrategyType
    }
    assert corral.SchedulingStrategy(theirs.colocation, "x").type == "colocation"


SAMPLES = {
    "worker_key": "rollout",
    "worker_id": "rollout/0",
    "reason": "why",
    "details": "more",
    "exit_code": 3,
    "stderr": "tail",
    "status_code": 500,
    "method": "generate",
    "attempt": 2,
    "timeout": 5.0,
    "host": "10.0.0.1",
    "port": 8000,
    "import_path": "pkg.Engine",
}


def test_exceptions_names_constructors_and_attributes(areal):
    module = areal["areal.infra.scheduler.exceptions"]
    classes = [
        c for _, c in inspect.getmembers(module, inspect.isclass) if c.__module__ == module.__name__
    ]
    assert len(classes) >= 12
    for theirs in classes:
        ours = getattr(corral.errors, theirs.__name__)
        assert issubclass(ours, corral.errors.SchedulerError)
        if theirs.__init__ is Exception.__init__:
            continue
        their_params = [p for p in inspect.signature(theirs.__init__).parameters if p != "self"]
        our_params = [p for p in inspect.signature(ours.__init__).parameters if p != "self"]
        assert our_params[: len(their_params)] == their_params, theirs.__name__
        args = [SAMPLES[p] for p in their_params]
        expected, got = theirs(*args), ours(*args)
        for attribute, value in vars(expected).items():
            assert getattr(got, attribute) == value, f"{theirs.__name__}.{attribute}"


def test_every_difference_is_documented():
    text = DOC.read_text()
    missing = sorted(key for key in DIFFERENT_DEFAULTS if f"`{key}`" not in text)
    assert missing == [], f"add these to docs/areal.md: {missing}"
