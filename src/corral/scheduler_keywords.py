"""Scheduler constructor options: AReaL 1.0.4's keywords, type-checked, merged with a config.

As in AReaL, an ``exp_config`` wins over the keywords it also holds (experiment and trial
names, ``fileroot``, name-resolve settings, ``n_gpus_per_node``, offload). A value of the
wrong type is a ``ConfigError`` naming the keyword, before anything starts.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

from corral.config import ClusterSpecConfig, NameResolveConfig, cluster_field
from corral.errors import ConfigError

NAME_RESOLVE_KINDS = ("nfs", "etcd3", "memory", "ray")


def looks_like_config(value: Any) -> bool:
    """True for an experiment config (has ``experiment_name`` or ``cluster``)."""
    return not isinstance(value, str | bytes | list | tuple | int | float) and (
        hasattr(value, "experiment_name") or hasattr(value, "cluster")
    )


def config_first(init: Callable[..., None]) -> Callable[..., None]:
    """Let a scheduler's ``__init__`` take an experiment config as its first positional
    argument (corral's older form) beside any keyword, on every backend: the config moves
    to ``exp_config`` before Python binds the arguments, so ``RayScheduler(cfg,
    startup_timeout=60)`` works like ``LocalScheduler(cfg, startup_timeout=60)``. The
    signature ``inspect`` reports stays ``init``'s (AReaL's)."""

    @functools.wraps(init)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
        if args and looks_like_config(args[0]):
            if kwargs.get("exp_config") is not None:
                raise ConfigError(
                    "exp_config",
                    type(kwargs["exp_config"]).__name__,
                    "pass the experiment config once: first or as exp_config=, not both",
                )
            kwargs["exp_config"], args = args[0], args[1:]
        init(self, *args, **kwargs)

    return wrapper


def check_type(name: str, value: Any, types: tuple[type, ...], what: str) -> None:
    if value is None:
        return
    if isinstance(value, bool) and bool not in types:
        raise ConfigError(name, value, f"use {what}")
    if not isinstance(value, types):
        raise ConfigError(name, value, f"use {what}, not a {type(value).__name__}")


def check_number(name: str, value: Any, minimum: float = 0.0) -> float | None:
    check_type(name, value, (int, float), "a number of seconds")
    if value is not None and value < minimum:
        raise ConfigError(name, value, f"use a number >= {minimum}")
    return None if value is None else float(value)


def check_gpu_devices(value: Any) -> list[int] | None:
    if value is None:
        return None
    if looks_like_config(value):
        raise ConfigError(
            "gpu_devices", type(value).__name__, "pass the experiment config as exp_config=cfg"
        )
    if not isinstance(value, list | tuple) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in value
    ):
        raise ConfigError("gpu_devices", value, "use a list of GPU indices such as [0, 1]")
    return list(value)


def check_exp_config(value: Any) -> Any:
    if value is not None and not looks_like_config(value):
        raise ConfigError(
            "exp_config",
            value,
            "use an experiment config (corral.BaseExperimentConfig or AReaL's) or None",
        )
    return value


def names(exp_config: Any, experiment_name: Any, trial_name: Any) -> tuple[Any, Any]:
    check_type("experiment_name", experiment_name, (str,), "a str")
    check_type("trial_name", trial_name, (str,), "a str")
    if exp_config is not None:
        return (
            getattr(exp_config, "experiment_name", None) or experiment_name,
            getattr(exp_config, "trial_name", None) or trial_name,
        )
    return experiment_name, trial_name


def n_gpus(exp_config: Any, keyword: Any, default: int | None = None) -> int:
    """The config's ``cluster.n_gpus_per_node`` if there is a config, else the keyword."""
    check_type("n_gpus_per_node", keyword, (int,), "a whole number >= 0")
    cluster = getattr(exp_config, "cluster", None) if exp_config is not None else None
    value = getattr(cluster, "n_gpus_per_node", None) if cluster is not None else None
    if value is None:
        value = keyword
    if value is None:
        value = default if default is not None else ClusterSpecConfig().n_gpus_per_node
    return int(value)


def name_resolve(exp_config: Any, kind: Any, nfs_record_root: Any, etcd3_addr: Any) -> Any:
    """The config's ``cluster.name_resolve`` if there is a config, else one from keywords
    (None: none given, use the default store under ``fileroot``)."""
    check_type("name_resolve_type", kind, (str,), "one of " + ", ".join(NAME_RESOLVE_KINDS))
    if kind is not None and kind not in NAME_RESOLVE_KINDS:
        raise ConfigError("name_resolve_type", kind, f"use one of {', '.join(NAME_RESOLVE_KINDS)}")
    check_type("nfs_record_root", nfs_record_root, (str, os.PathLike), "a directory path")
    check_type("etcd3_addr", etcd3_addr, (str,), "host:port of an etcd server")
    if exp_config is not None and getattr(exp_config, "cluster", None) is not None:
        return cluster_field(exp_config, "name_resolve")
    if kind is None and nfs_record_root is None and etcd3_addr is None:
        return None
    return NameResolveConfig(
        type=kind or "nfs",
        nfs_record_root=os.fspath(nfs_record_root) if nfs_record_root else None,
        etcd3_addr=etcd3_addr,
    )


def offload(exp_config: Any, keyword: Any) -> bool:
    check_type("enable_tms_offload", keyword, (bool,), "True or False")
    if exp_config is not None and hasattr(exp_config, "enable_offload"):
        return bool(exp_config.enable_offload)
    return bool(keyword)


def fileroot(exp_config: Any, keyword: Any) -> str:
    """The ``fileroot`` keyword, else the config's ``cluster.fileroot`` (unlike AReaL, the
    keyword wins: tests and tools point one config at a scratch directory)."""
    check_type("fileroot", keyword, (str, os.PathLike), "a directory path")
    if keyword is not None:
        return os.fspath(keyword)
    return cluster_field(exp_config, "fileroot")
