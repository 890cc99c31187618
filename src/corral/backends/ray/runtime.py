"""The driver's Ray runtime: Ray imported quietly and on first use (``import corral``
must stay light), then the runtime this process already has, a cluster to join, or a
local one of our own."""

from __future__ import annotations

import os
from typing import Any

from corral.backends.backend_options import RayOptions
from corral.backends.ray.private_api import running_cluster_address

QUIET_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_DEDUP_LOGS": "0",
    "RAY_DISABLE_IMPORT_WARNING": "1",
    "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
    "RAY_enable_metrics_collection": "0",
}
DEFAULT_OBJECT_STORE_MEMORY = 512 * 1024**2


def apply_quiet_env() -> None:
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)


def import_ray() -> Any:
    """The ``ray`` module, imported now (with the quiet environment)."""
    apply_quiet_env()
    try:
        import ray
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "RayScheduler needs Ray: pip install 'corral[ray]' (ray==2.60.0)"
        ) from exc
    return ray


def join_runtime(options: RayOptions) -> tuple[Any, bool, bool]:
    """``(ray, started, own)``: the runtime this process already has (used as it is,
    never shut down by us), else the cluster at ``options.address`` / ``RAY_ADDRESS`` /
    the one running on this machine, else a local runtime of our own (``own``: it ends
    with this process). ``started``: ``ray.init`` was called here."""
    ray = import_ray()
    if ray.is_initialized():
        return ray, False, False
    address = options.address or os.environ.get("RAY_ADDRESS") or running_cluster_address()
    kwargs: dict[str, Any] = {"log_to_driver": False}
    if address and address != "local":
        kwargs.update(options.init_kwargs or {})
        ray.init(address=address, **kwargs)
        return ray, True, False
    # "local" or nothing running: start a runtime of our own
    kwargs.update(include_dashboard=False, object_store_memory=DEFAULT_OBJECT_STORE_MEMORY)
    kwargs.update(options.init_kwargs or {})
    ray.init(address="local", **kwargs)
    return ray, True, True
