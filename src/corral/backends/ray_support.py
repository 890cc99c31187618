"""Small driver-side helpers of the Ray backend: importing Ray quietly and on first use,
joining a runtime already running here, names of a trial's groups and actors, readable
resource and death messages."""

from __future__ import annotations

import os
from typing import Any

from corral.backends.ray_actor import RayWorkerActor

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


def _ray():
    """Import Ray on first use only (``import corral`` must stay light)."""
    apply_quiet_env()
    try:
        import ray
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "RayScheduler needs Ray: pip install 'corral[ray]' (ray==2.60.0)"
        ) from exc
    return ray


def name_prefix(experiment: str, trial: str) -> str:
    """Every placement group and actor of a trial is named ``<prefix>:<role>[:<index>]``."""
    return f"corral:{experiment}:{trial}"


def format_resources(resources: dict[str, float]) -> str:
    """Readable summary of a Ray resource dict (internal and per-node entries left out)."""
    parts = []
    for key in sorted(resources):
        if key.startswith("node:") or "_group_" in key or key == "object_store_memory":
            continue
        value = resources[key]
        if key == "memory":
            parts.append(f"memory {value / 1024**3:.1f} GiB")
        else:
            parts.append(f"{key} {int(value) if float(value).is_integer() else round(value, 3)}")
    return "{" + ", ".join(parts) + "}"


_ACTOR_CLASS: list[Any] = []


def _actor_class(ray: Any) -> Any:
    if not _ACTOR_CLASS:
        _ACTOR_CLASS.append(ray.remote(RayWorkerActor))
    return _ACTOR_CLASS[0]


def _pg_name(pg: Any) -> str:
    from ray.util.placement_group import placement_group_table

    try:
        return placement_group_table(pg).get("name") or pg.id.hex()
    except Exception:
        return pg.id.hex()


def _death_reason(exc: BaseException) -> str:
    """Ray's death cause, without its generic troubleshooting paragraph."""
    lines = [line.strip() for line in str(exc).splitlines()]
    detail = {}
    kept = []
    for line in lines:
        key, sep, value = line.partition(": ")
        if sep and key in ("class_name", "actor_id", "pid", "name", "namespace", "ip"):
            detail[key] = value
        elif line:
            kept.append(line)
    text = " ".join(kept)
    cut = text.find(" Some common causes include")
    if cut > 0:
        text = text[:cut]
    where = ", ".join(f"{k} {detail[k]}" for k in ("name", "pid", "ip") if k in detail)
    return f"Ray actor died ({where}): {text}" if where else f"Ray actor died: {text}"


def _running_local_cluster() -> str | None:
    """The address of a Ray runtime already running on this machine, as ``ray.init()``
    itself would find it (``/tmp/ray/ray_current_cluster``), or None."""
    try:
        from ray._private import services

        return services.canonicalize_bootstrap_address(None)
    except Exception:
        return None
