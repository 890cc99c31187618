"""What a controller is set up with, resolved once: AReaL's keywords, then the
experiment config, then the defaults (see ``corral.scheduler_keywords`` for which wins). It names
the trial, checks numbers and directories, and opens the name-resolve store. A dry run
checks the directories without creating anything and only describes the store.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from corral import scheduler_keywords as opts
from corral.config import cluster_field, scheduler_field
from corral.discovery import (
    NameResolve,
    PlannedNameResolve,
    describe_name_resolve,
    make_name_resolve,
)
from corral.errors import ConfigError
from corral.paths import TrialPaths, check_dir
from corral.safedirs import ensure_private_dir, make_private_subdir
from corral.spec import validate_role_name


def ensure_dir(path: str, field_name: str) -> None:
    """Create ``path`` (0700) if needed; ConfigError (field, path, fix) if impossible."""
    try:
        make_private_subdir(path)
    except OSError as exc:
        raise ConfigError(
            field_name, path, f"cannot create it ({exc.strerror}); use a writable directory"
        ) from None
    check_dir(path, field_name, create=False)


@dataclass(frozen=True)
class ControllerSettings:
    exp_config: Any
    experiment_name: str
    trial_name: str
    n_gpus_per_node: int
    startup_timeout: float
    health_check_interval: float
    enable_tms_offload: bool
    fileroot: str
    paths: TrialPaths
    name_resolve: NameResolve
    """The store itself (not yet signed with the trial secret)."""

    @classmethod
    def resolve(
        cls,
        exp_config: Any = None,
        *,
        dry_run: bool = False,
        name_resolve: NameResolve | None = None,
        n_gpus_per_node: int | None = None,
        startup_timeout: float | None = None,
        fileroot: str | None = None,
        experiment_name: str | None = None,
        trial_name: str | None = None,
        log_dir: str | os.PathLike | None = None,
        health_check_interval: float | None = None,
        enable_tms_offload: bool | None = None,
        name_resolve_type: str | None = None,
        nfs_record_root: str | None = None,
        etcd3_addr: str | None = None,
    ) -> ControllerSettings:
        exp_config = opts.check_exp_config(exp_config)
        experiment, trial = opts.names(exp_config, experiment_name, trial_name)
        gpus = opts.n_gpus(exp_config, n_gpus_per_node)
        if gpus < 0:
            raise ConfigError("n_gpus_per_node", gpus, "use a whole number >= 0")
        timeout = opts.check_number("startup_timeout", startup_timeout)
        if timeout is None:
            timeout = scheduler_field(exp_config, "startup_timeout")
        interval = opts.check_number("health_check_interval", health_check_interval)
        root = os.path.abspath(opts.fileroot(exp_config, fileroot))
        if dry_run:  # refuses what the real run would, creating nothing
            check_dir(root, "cluster.fileroot", create=False)
        else:
            ensure_private_dir(root, "cluster.fileroot")
        opts.check_type("log_dir", log_dir, (str, os.PathLike), "a directory path")
        experiment = validate_role_name(experiment or "corral", "experiment_name")
        trial = validate_role_name(trial or "trial0", "trial_name")
        own_log_dir = None if log_dir is None else os.path.abspath(os.fspath(log_dir))
        paths = TrialPaths.of(root, experiment, trial, own_log_dir)
        if own_log_dir is not None and dry_run:
            check_dir(own_log_dir, "log_dir", create=False)
        elif own_log_dir is not None:
            ensure_dir(own_log_dir, "log_dir")
        resolve_cfg = opts.name_resolve(exp_config, name_resolve_type, nfs_record_root, etcd3_addr)
        if resolve_cfg is None:
            resolve_cfg = cluster_field(exp_config, "name_resolve")
        if name_resolve is None and dry_run:
            name_resolve = PlannedNameResolve(describe_name_resolve(resolve_cfg, root))
        return cls(
            exp_config=exp_config,
            experiment_name=experiment,
            trial_name=trial,
            n_gpus_per_node=gpus,
            startup_timeout=float(timeout),
            health_check_interval=interval if interval is not None else 1.0,
            enable_tms_offload=opts.offload(exp_config, enable_tms_offload),
            fileroot=root,
            paths=paths,
            name_resolve=name_resolve or make_name_resolve(resolve_cfg, root),
        )
