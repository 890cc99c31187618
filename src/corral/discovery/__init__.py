"""Name-resolve: where workers publish their addresses and the controller finds them."""

from __future__ import annotations

import os

from corral.discovery.base import NameResolve, check_key
from corral.discovery.files import FileNameResolve
from corral.errors import ConfigError

TYPE_CHECKING = False  # typing's, without importing typing (a worker's start)
if TYPE_CHECKING:
    from typing import Any

NAME_RESOLVE_TYPES = ("nfs", "memory", "etcd3", "ray")


def make_name_resolve(cfg: Any, fileroot: str | None = None) -> NameResolve:
    """Build the store named by a name-resolve config (object or dict)."""
    get = cfg.get if isinstance(cfg, dict) else lambda k, d=None: getattr(cfg, k, d)
    kind = get("type", "nfs") or "nfs"
    if kind in ("nfs", "files"):
        root = get("nfs_record_root") or get("root") or _default_records(fileroot)
        return FileNameResolve(root)
    if kind == "memory":
        from corral.discovery.memory import MemoryNameResolve

        return MemoryNameResolve()
    if kind == "etcd3":
        from corral.discovery.etcd import EtcdNameResolve

        address = get("etcd3_addr") or get("address")
        if not address:
            raise ConfigError(
                "cluster.name_resolve.etcd3_addr", address, "set it to host:port of your etcd"
            )
        return EtcdNameResolve(address)
    if kind == "ray":  # Ray's GCS key-value store (a worker gets the address in describe())
        from corral.discovery.ray_kv import RayNameResolve

        return RayNameResolve(get("address"))
    raise ConfigError(
        "cluster.name_resolve.type", kind, f"use one of {', '.join(NAME_RESOLVE_TYPES)}"
    )


def describe_name_resolve(cfg: Any, fileroot: str | None = None) -> dict:
    """What ``make_name_resolve(cfg, fileroot).describe()`` would say, without creating
    anything (no directory, no connection): what a dry run shows."""
    get = cfg.get if isinstance(cfg, dict) else lambda k, d=None: getattr(cfg, k, d)
    kind = get("type", "nfs") or "nfs"
    if kind in ("nfs", "files"):
        root = get("nfs_record_root") or get("root") or _default_records(fileroot)
        return {"type": "nfs", "root": os.path.abspath(root)}
    if kind == "memory":
        return {"type": "memory"}
    if kind == "etcd3":
        address = get("etcd3_addr") or get("address")
        if not address:
            raise ConfigError(
                "cluster.name_resolve.etcd3_addr", address, "set it to host:port of your etcd"
            )
        return {"type": "etcd3", "address": address}
    if kind == "ray":
        return {"type": "ray", "address": get("address") or "(the Ray cluster's GCS)"}
    raise ConfigError(
        "cluster.name_resolve.type", kind, f"use one of {', '.join(NAME_RESOLVE_TYPES)}"
    )


def _default_records(fileroot: str | None) -> str:
    """The records under ``fileroot`` (default: the user's own fileroot)."""
    from corral.paths import records_root
    from corral.safedirs import default_fileroot

    return records_root(fileroot or default_fileroot())


def __getattr__(name: str) -> Any:
    # the in-memory stores are imported on first use: a worker never needs them
    if name == "MemoryNameResolve":
        from corral.discovery.memory import MemoryNameResolve

        return MemoryNameResolve
    if name == "PlannedNameResolve":
        from corral.discovery.memory import PlannedNameResolve

        return PlannedNameResolve
    raise AttributeError(f"module 'corral.discovery' has no attribute {name!r}")


def name_resolve_from_description(desc: dict) -> NameResolve:
    """Rebuild a store from ``NameResolve.describe()`` (used by worker processes)."""
    return make_name_resolve(desc)


__all__ = [
    "NameResolve",
    "FileNameResolve",
    "MemoryNameResolve",
    "make_name_resolve",
    "describe_name_resolve",
    "PlannedNameResolve",
    "name_resolve_from_description",
    "check_key",
]
