"""Heterogeneous resources of a worker: the checks of ``SchedulingSpec``'s Slurm fields
(``partition``, ``constraint``, ``reservation``, ``exclusive``) and Ray fields
(``ray_resources``, ``accelerator_type``), and what each backend asks for with them.
Pure functions: the backends compare them with what their cluster has (docs/shapes.md)."""

from __future__ import annotations

import re
from typing import Any

from corral.errors import ConfigError

#: Ray's node resource for an accelerator type (``ray.util.accelerators``): a node of type
#: T carries ``accelerator_type:T`` = 1, and asking a tiny share of it pins the bundle there.
ACCELERATOR_PREFIX = "accelerator_type:"
ACCELERATOR_SHARE = 0.001
_RAY_BUILTIN = frozenset({"CPU", "GPU", "NPU", "memory", "object_store_memory"})
_FEATURE_RE = re.compile(r"[A-Za-z0-9_.:+-]+")


def _one_word(name: str, value: object) -> None:
    if value is None:
        return
    if not isinstance(value, str) or not value or any(c.isspace() for c in value):
        raise ConfigError(name, value, "use a non-empty name without spaces (or None)")


def validate_resource_fields(spec: Any, prefix: str = "SchedulingSpec") -> None:
    """Raise ConfigError (field, value, fix) for a malformed resource field."""
    for name in ("reservation", "partition", "constraint", "accelerator_type"):
        _one_word(f"{prefix}.{name}", getattr(spec, name))
    if not isinstance(spec.exclusive, bool):
        raise ConfigError(f"{prefix}.exclusive", spec.exclusive, "use True or False")
    resources = spec.ray_resources
    if not isinstance(resources, dict):
        raise ConfigError(
            f"{prefix}.ray_resources", resources, 'use a dict such as {"tpu_slice": 1}'
        )
    for key, amount in resources.items():
        field = f"{prefix}.ray_resources[{key!r}]"
        if not isinstance(key, str) or not key or key in _RAY_BUILTIN:
            raise ConfigError(
                field,
                amount,
                "name a custom Ray resource; CPU, GPU and memory come from cpu/gpu/mem",
            )
        if key.startswith(ACCELERATOR_PREFIX):
            raise ConfigError(field, amount, "use accelerator_type='<type>' instead")
        if isinstance(amount, bool) or not isinstance(amount, int | float) or amount <= 0:
            raise ConfigError(field, amount, "use an amount > 0 per worker")


def ray_extra_resources(spec: Any) -> dict[str, float]:
    """What a worker's Ray bundle asks for beyond CPU, accelerators and memory."""
    extra = {str(k): float(v) for k, v in spec.ray_resources.items()}
    if spec.accelerator_type:
        extra[ACCELERATOR_PREFIX + spec.accelerator_type] = ACCELERATOR_SHARE
    return extra


def unknown_ray_resources(wanted: set[str], cluster: dict[str, float]) -> str | None:
    """Why resources ``wanted`` can never be had on a Ray cluster with ``cluster``
    (``ray.cluster_resources()``), with the values it does have; None if all exist."""
    missing = sorted(k for k in wanted if cluster.get(k, 0) <= 0)
    if not missing:
        return None
    types = sorted(
        k[len(ACCELERATOR_PREFIX) :] for k in cluster if k.startswith(ACCELERATOR_PREFIX)
    )
    custom = sorted(
        k
        for k in cluster
        if k not in _RAY_BUILTIN
        and not k.startswith(ACCELERATOR_PREFIX)
        and not k.startswith("node:")
        and "_group_" not in k
    )
    return (
        f"no node of the Ray cluster has {', '.join(missing)} (accelerator types: "
        f"{', '.join(types) or 'none'}; custom resources: {', '.join(custom) or 'none'}); "
        "start the nodes with --resources / the accelerator type, or ask for one of those"
    )


def constraint_features(constraint: str) -> list[str]:
    """The feature names in a Slurm ``--constraint`` expression (``a&b|c``, ``[x*2&y]``)."""
    names = _FEATURE_RE.findall(constraint.replace("*", " "))
    return [n for n in names if not n.isdigit()]


def slurm_directives(spec: Any, partition: str | None) -> list[str]:
    """The sbatch directives of a spec's Slurm resources (``partition``: the scheduler's,
    used when the spec names none)."""
    out = []
    chosen = spec.partition or partition
    if chosen:
        out.append(f"--partition={chosen}")
    if spec.constraint:
        out.append(f"--constraint={spec.constraint}")
    if spec.reservation:
        out.append(f"--reservation={spec.reservation}")
    if spec.exclusive:
        out.append("--exclusive")
    return out
