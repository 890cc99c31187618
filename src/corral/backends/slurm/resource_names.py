"""Slurm: whether a role's partition, constraint and reservation exist on the cluster.

A role that names a partition, node feature or reservation Slurm does not have is
refused before ``sbatch`` with what the cluster does have (read once per launcher with
``sinfo`` and ``scontrol show reservation``, each a fraction of a second), instead of
waiting in the queue for a reason that never clears."""

from __future__ import annotations

from dataclasses import dataclass, field

from corral.resources import constraint_features


@dataclass
class SlurmResources:
    """What the cluster offers by name: partitions, node features, reservations."""

    partitions: list[str] = field(default_factory=list)
    features: set[str] = field(default_factory=set)
    reservations: list[str] = field(default_factory=list)
    reservation_text: str = ""
    """``scontrol show reservation``'s own words when there is none."""


def read_resources(run) -> SlurmResources | None:
    """The names the cluster offers, or None if sinfo cannot be asked."""
    try:
        nodes = run(["sinfo", "-h", "-N", "-o", "%N|%P|%f"], timeout=10)
        res = run(["scontrol", "-o", "show", "reservation"], timeout=10)
    except Exception:
        return None
    if nodes.returncode != 0:
        return None
    out = SlurmResources()
    for line in nodes.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 3:
            continue
        partition = parts[1].rstrip("*")
        if partition not in out.partitions:
            out.partitions.append(partition)
        out.features.update(f for f in parts[2].split(",") if f and f != "(null)")
    for line in res.stdout.splitlines():
        for word in line.split():
            if word.startswith("ReservationName="):
                out.reservations.append(word.split("=", 1)[1])
    if not out.reservations:
        out.reservation_text = (res.stdout or res.stderr).strip()
    return out


def resource_problem(
    found: SlurmResources | None,
    partition: str | None,
    constraint: str | None,
    reservation: str | None,
) -> tuple[str, object, str] | None:
    """(field, value, why with the cluster's names) for a name Slurm does not have."""
    if found is None:
        return None
    if partition and partition not in found.partitions:
        return (
            "partition",
            partition,
            f"Slurm has no partition {partition!r} (sinfo lists: "
            f"{', '.join(found.partitions) or 'none'}); use one of those",
        )
    if constraint:
        unknown = [f for f in constraint_features(constraint) if f not in found.features]
        if unknown:
            return (
                "constraint",
                constraint,
                f"no node has feature(s) {', '.join(unknown)} (node features in sinfo: "
                f"{', '.join(sorted(found.features)) or 'none'}); use one of those or drop "
                "constraint",
            )
    if reservation and reservation not in found.reservations:
        said = f"; scontrol says: {found.reservation_text}" if found.reservation_text else ""
        return (
            "reservation",
            reservation,
            f"Slurm has no reservation {reservation!r} (reservations: "
            f"{', '.join(found.reservations) or 'none'}{said}); use one of those or drop "
            "reservation",
        )
    return None
