"""Name-resolve on Ray's own storage: the key-value store of the Ray cluster's GCS
(``cluster.name_resolve.type="ray"``, as AReaL's ``RayNameResolveRepository``), for Ray
users without a shared filesystem or an etcd.

Each process talks to the GCS at the cluster's address with a GCS client of its own, so
a worker needs no ``ray.init`` (it must reach the GCS port, as every Ray node does). Keys
live in their own namespace (:data:`NAMESPACE`). The records are signed with the trial
secret by ``SignedNameResolve`` like those of the file and etcd stores, so whoever else
can write to the GCS cannot plant an address the controller would connect to.

The address is, in order: the one given (a worker gets it from ``describe()``), the Ray
runtime this process has joined (``ray.init``, or a RayScheduler created first),
``RAY_ADDRESS``, a Ray runtime started on this machine (``ray start --head``).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from corral.discovery.base import KEY_SEP, NameResolve, check_key
from corral.errors import ConfigError, NameResolveError

NAMESPACE = b"corral_name_resolve"
TIMEOUT = 30.0  # seconds one GCS request may take


def cluster_address(explicit: str | None = None) -> str:
    """The GCS address of the Ray cluster to keep records in (see the module docstring)."""
    if explicit:
        return explicit
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return ray.get_runtime_context().gcs_address
    from_env = os.environ.get("RAY_ADDRESS", "")
    if from_env.startswith("ray://"):
        raise ConfigError(
            "RAY_ADDRESS",
            from_env,
            "name_resolve type 'ray' talks to the GCS directly: use the cluster's GCS address "
            "(host:6379), not a Ray Client address",
        )
    if from_env and from_env not in ("auto", "local"):
        return from_env
    try:
        from ray._private import services

        running = services.canonicalize_bootstrap_address(None)
    except Exception:
        running = None
    if running:
        return running
    raise ConfigError(
        "cluster.name_resolve.type",
        "ray",
        "no Ray cluster to keep the records in: start one (ray start --head), set RAY_ADDRESS "
        "to its GCS address, or create the RayScheduler (it joins or starts one) first",
    )


class RayNameResolve(NameResolve):
    """Keys and values in the GCS key-value store of one Ray cluster."""

    def __init__(self, address: str | None = None):
        for name in ("RAY_USAGE_STATS_ENABLED", "RAY_enable_metrics_collection"):
            os.environ.setdefault(name, "0")  # as the Ray backend does (ray_support)
        try:
            from ray._raylet import GcsClient
        except ImportError as exc:
            raise ConfigError(
                "cluster.name_resolve.type",
                "ray",
                f"it needs Ray: pip install 'corral[ray]' ({exc})",
            ) from None
        self.address = cluster_address(address)
        try:
            self._gcs = GcsClient(address=self.address)
            self._gcs.internal_kv_get(b"-", NAMESPACE, timeout=TIMEOUT)  # reachable now?
        except Exception as exc:
            raise ConfigError(
                "cluster.name_resolve.type",
                "ray",
                f"cannot reach the Ray cluster's GCS at {self.address} ({exc}); start Ray "
                "or set RAY_ADDRESS to a running cluster",
            ) from None

    def _call(self, what: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args, NAMESPACE, timeout=TIMEOUT)
        except Exception as exc:
            raise NameResolveError(
                f"name-resolve {what} on the Ray GCS at {self.address} failed: {exc}"
            ) from exc

    def add(self, key: str, value: str, replace: bool = False) -> None:
        check_key(key)
        added = self._call("add", self._gcs.internal_kv_put, key.encode(), value.encode(), replace)
        if not added and not replace:
            raise NameResolveError(f"name-resolve key {key!r} already exists")

    def get(self, key: str) -> str | None:
        check_key(key)
        value = self._call("get", self._gcs.internal_kv_get, key.encode())
        return None if value is None else value.decode()

    def _below(self, prefix: bytes) -> dict[str, str]:
        found = {}
        for raw in self._call("list", self._gcs.internal_kv_keys, prefix):
            value = self._call("get", self._gcs.internal_kv_get, raw)
            if value is not None:  # deleted meanwhile
                found[raw.decode()] = value.decode()
        return found

    def get_subtree(self, prefix: str) -> dict[str, str]:
        check_key(prefix)
        return self._below((prefix + KEY_SEP).encode())

    def get_all(self) -> dict[str, str]:
        return self._below(b"")

    def delete(self, key: str) -> None:
        check_key(key)
        self._call("delete", self._gcs.internal_kv_del, key.encode(), False)

    def clear_subtree(self, prefix: str) -> None:
        check_key(prefix)
        self._call("delete", self._gcs.internal_kv_del, prefix.encode(), False)
        self._call("delete", self._gcs.internal_kv_del, (prefix + KEY_SEP).encode(), True)

    def describe(self) -> dict:
        return {"type": "ray", "address": self.address}
