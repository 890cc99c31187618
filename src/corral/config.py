"""Experiment configuration: dataclasses, YAML files and dotted overrides."""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from dataclasses import dataclass, field
from typing import Any, TypeVar

from corral.backends import backend_names, scheduler_class
from corral.backends.backend_options import RayOptions, SlurmOptions, legacy_keys
from corral.backends.backend_options import section_value as _field_of
from corral.config_sections import (
    near_miss,
    parse_override_value,
    read_yaml_file,
    set_aside_unowned,
)
from corral.errors import ConfigError
from corral.safedirs import default_fileroot

SCHEDULER_TYPES = backend_names()


@dataclass
class NameResolveConfig:
    """``nfs``: files under ``nfs_record_root`` (default ``<fileroot>/name_resolve``);
    ``etcd3``: an etcd server at ``etcd3_addr``; ``ray``: the key-value store of the Ray
    cluster's GCS (corral.discovery.ray_kv); ``memory``: in-process, for unit tests."""

    type: str = "nfs"
    nfs_record_root: str | None = None
    etcd3_addr: str | None = None


@dataclass
class ClusterSpecConfig:
    n_nodes: int = 1
    n_gpus_per_node: int = 8
    fileroot: str = field(default_factory=default_fileroot)  # /tmp/corral-<user>
    cluster_name: str = "local"
    name_resolve: NameResolveConfig = field(default_factory=NameResolveConfig)
    gpu_devices: list[int] | None = None


@dataclass
class SchedulerConfig:
    """``type`` picks the backend (a name in ``corral.backends.BACKENDS``); ``ray`` and
    ``slurm`` hold that backend's options (``corral.backends.backend_options``). The flat keys of
    older configs (``scheduler.ray_address``, ``scheduler.partition``, ...) are read into
    their section."""

    type: str = "local"
    startup_timeout: float = 120.0
    ray: RayOptions = field(default_factory=RayOptions)
    slurm: SlurmOptions = field(default_factory=SlurmOptions)


@dataclass
class BaseExperimentConfig:
    experiment_name: str = "corral"
    trial_name: str = "trial0"
    cluster: ClusterSpecConfig = field(default_factory=ClusterSpecConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    extra: dict[str, Any] = field(default_factory=dict)
    """Top-level sections of a config file that corral does not own (an AReaL config's
    ``actor``, ``rollout``, ``gconfig``, ...), kept as read for the user's code and
    ignored by corral (see ``corral.config_sections``)."""


def cluster_field(cfg: Any, name: str) -> Any:
    """A cluster setting from a possibly partial cluster object, with the default filled in."""
    cluster = getattr(cfg, "cluster", None)
    default = getattr(ClusterSpecConfig(), name)
    value = _field_of(cluster, name)
    return default if value is None else value


def scheduler_field(cfg: Any, name: str) -> Any:
    sched = getattr(cfg, "scheduler", None)
    default = getattr(SchedulerConfig(), name)
    value = _field_of(sched, name)
    return default if value is None else value


C = TypeVar("C")


def load_expr_config(argv: list[str], config_cls: type[C]) -> tuple[C, str | None]:
    """Build ``config_cls`` from YAML files and ``a.b=value`` overrides.

    ``argv`` items: a YAML path (``x.yaml`` or ``--config x.yaml``) and overrides such as
    ``scheduler.type=ray``. Returns the config and the YAML path used (or None).
    """

    data: dict = {}
    config_path = None
    overrides: list[str] = []
    items = list(argv)
    while items:
        item = items.pop(0)
        if item in ("--config", "-c"):
            if not items:
                raise ConfigError("--config", None, "give the path of a YAML file after --config")
            item = items.pop(0)
            config_path = item
        elif "=" in item and not item.endswith((".yaml", ".yml")):
            overrides.append(item)
            continue
        elif item.endswith((".yaml", ".yml")):
            config_path = item
        else:
            raise ConfigError("argv", item, "give a YAML file or a dotted override like a.b=1")
        if not os.path.exists(item):
            raise ConfigError(
                "config file",
                item,
                f"the file does not exist (relative to {os.getcwd()}); check the path",
            )
        loaded = read_yaml_file(item)
        _merge(data, loaded)
    for override in overrides:
        key, _, raw = override.partition("=")
        _set_dotted(data, key.strip(), parse_override_value(override, raw) if raw else raw)
    return build_dataclass(config_cls, data, config_cls.__name__), config_path


def _merge(into: dict, new: dict) -> None:
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def _set_dotted(data: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    node = data
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(key, value, f"{part!r} is not a section")
    node[parts[-1]] = value


def build_dataclass(cls: type, data: Any, path: str) -> Any:
    """Recursively build dataclass ``cls`` from plain data, naming unknown fields."""
    if not isinstance(data, dict):
        raise ConfigError(path, data, f"expected a mapping for {cls.__name__}")
    if cls is SchedulerConfig:
        data = _nest_legacy(data, path)
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    data = set_aside_unowned(cls, data, names, path)
    unknown = sorted(set(data) - names)
    if unknown:
        match = near_miss(str(unknown[0]), names)
        hint = f"; did you mean {match!r}?" if match else ""
        raise ConfigError(
            f"{path}.{unknown[0]}",
            data[unknown[0]],
            f"{cls.__name__} has fields {sorted(names)}{hint}",
        )
    kwargs = {
        name: _coerce(hints.get(name, Any), value, f"{path}.{name}") for name, value in data.items()
    }
    return cls(**kwargs)


def _nest_legacy(data: dict, path: str) -> dict:
    """Move old flat keys into their section (``partition`` -> ``slurm.partition``)."""
    data = dict(data)
    for key, (section, name) in legacy_keys().items():
        if key not in data:
            continue
        nested = data.setdefault(section, {})
        if not isinstance(nested, dict):
            raise ConfigError(f"{path}.{section}", nested, "expected a mapping")
        nested = data[section] = dict(nested)
        if name in nested:
            raise ConfigError(
                f"{path}.{key}", data[key], f"it is also set as {path}.{section}.{name}; keep one"
            )
        nested[name] = data.pop(key)
    return data


def _coerce(hint: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None:
            return None
        for option in options:
            try:
                return _coerce(option, value, path)
            except (ConfigError, TypeError, ValueError):
                continue
        return value
    if dataclasses.is_dataclass(hint):
        if isinstance(value, dict):
            return build_dataclass(hint, value, path)
        if not isinstance(value, hint):
            raise ConfigError(path, value, f"expected a mapping for {hint.__name__}")
        return value
    if origin is list and isinstance(value, list):
        (inner,) = typing.get_args(hint) or (Any,)
        return [_coerce(inner, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict and isinstance(value, dict):
        args = typing.get_args(hint)
        inner = args[1] if len(args) == 2 else Any
        return {k: _coerce(inner, v, f"{path}.{k}") for k, v in value.items()}
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint in (int, float, str, bool) and not isinstance(value, hint):
        raise ConfigError(path, value, f"use a {hint.__name__}")
    return value


def make_scheduler(cfg: Any, **kwargs: Any):
    """The scheduler named by ``cfg.scheduler.type`` (a name in ``corral.backends.BACKENDS``)."""
    return scheduler_class(scheduler_field(cfg, "type"))(exp_config=cfg, **kwargs)
