"""What a worker asks Ray for: its bundle's resources, the cluster's accelerator kind,
the accelerator share and lifetime options of its actor, and resource dicts as text."""

from __future__ import annotations

from typing import Any

from corral.backends.ray.state import NAMESPACE
from corral.resources import ray_extra_resources

MAIN_SINGLE_GPU_SHARE = 0.9
FORK_ACCELERATOR_SHARE = 0.01


def accelerator_kind(ray: Any) -> str | None:
    """``GPU`` if the cluster has GPUs, else ``NPU`` if it has NPUs, else None."""
    resources = ray.cluster_resources()
    for kind in ("GPU", "NPU"):
        if resources.get(kind, 0) > 0:
            return kind
    return None


def bundle_of(spec: Any, kind: str | None, reserve_memory: bool) -> dict[str, float]:
    """The placement group bundle of one worker (``kind``: the accelerator resource)."""
    bundle: dict[str, float] = {}
    if spec.cpu:
        bundle["CPU"] = float(spec.cpu)
    if spec.gpu and kind:
        bundle[kind] = float(spec.gpu)
    if reserve_memory and spec.mem:
        bundle["memory"] = float(spec.mem * 1024**3)
    bundle.update(ray_extra_resources(spec))  # custom resources, accelerator type
    return bundle or {"CPU": 0.001}


def detached_options(outlive: float) -> dict:
    """Workers asked to outlive their controller (corral.attach) are detached actors in
    corral's namespace, so that they survive the driver and a new one finds them by name;
    otherwise (the default) they share the driver's fate."""
    return {"lifetime": "detached", "namespace": NAMESPACE} if outlive else {}


def accelerator_options(kind: str | None, gpu: int) -> dict:
    """The actor's share of its bundle's accelerator: 0.9 of a single GPU (forks fit
    beside it), all of several."""
    if not kind or not gpu:
        return {}
    share = MAIN_SINGLE_GPU_SHARE if gpu == 1 else float(gpu)
    return {"num_gpus": share} if kind == "GPU" else {"resources": {kind: share}}


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
