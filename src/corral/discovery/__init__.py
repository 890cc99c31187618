"""Name-resolve: where workers publish their addresses and the controller finds them."""

from __future__ import annotations

import os
from typing import Any

from corral.discovery.base import NameResolve, check_key
from corral.discovery.files import FileNameResolve
from corral.discovery.memory import MemoryNameResolve
from corral.errors import ConfigError
from corral.paths import records_root
from corral.safedirs import default_fileroot

NAME_RESOLVE_TYPES = ("nfs", "memory", "etcd3", "ray")


def make_name_resolve(cfg: Any, fileroot: str | None = None) -> NameResolve:
    """Build the store named by a name-resolve config (object or dict)."""
    get = cfg.get if isinstance(cfg, dict) else lambda k, d=None: getattr(cfg, k, d)
    kind = get("type", "nfs") or "nfs"
    if kind in ("nfs", "files"):
        root = get("nfs_record_root") or get("root")
        if not root:
            root = records_root(fileroot or default_fileroot())
        return FileNameResolve(root)
    if kind == "memory":
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
        root = get("nfs_record_root") or get("root") or records_root(fileroot or default_fileroot())
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


class PlannedNameResolve(MemoryNameResolve):
    """A dry run's store: empty, in memory, describing the store a real run would use."""

    def __init__(self, description: dict):
        super().__init__()
        self.description = description

    def describe(self) -> dict:
        return dict(self.description)


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
