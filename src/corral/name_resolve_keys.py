"""Where things live in name-resolve, for one experiment and trial."""

from __future__ import annotations

from corral.discovery.base import check_key


def trial_root(experiment: str, trial: str) -> str:
    return check_key(f"{experiment}/{trial}")


def worker_address_key(experiment: str, trial: str, role: str, index: int) -> str:
    """Holds ``ip:port`` of one worker."""
    return check_key(f"{experiment}/{trial}/{role}/{index}")


def role_prefix(experiment: str, trial: str, role: str) -> str:
    return check_key(f"{experiment}/{trial}/{role}")


def worker_info_key(experiment: str, trial: str, role: str, index: int) -> str:
    """Holds a JSON object: pid, host, reserved ports, generation."""
    return check_key(f"{experiment}/{trial}/_info/{role}/{index}")


def worker_usage_key(experiment: str, trial: str, role: str, index: int) -> str:
    """A worker's own CPU% and RSS of its process tree, rewritten every few seconds
    (corral.worker.usage)."""
    return check_key(f"{experiment}/{trial}/_usage/{role}/{index}")


def usage_prefix(experiment: str, trial: str) -> str:
    return check_key(f"{experiment}/{trial}/_usage")


def controller_key(experiment: str, trial: str) -> str:
    """The controller's lease: a heartbeat that changes every second while it lives."""
    return check_key(f"{experiment}/{trial}/_controller")


def health_prefix(experiment: str, trial: str, role: str) -> str:
    """The deaths recorded for one role's workers (one JSON record per index)."""
    return check_key(f"{experiment}/{trial}/_health/{role}")


def worker_health_key(experiment: str, trial: str, role: str, index: int) -> str:
    """A worker's death: written by the controller's health monitor, or for a forked
    worker that died alone, by the worker that forked it (see worker/fork.py)."""
    return check_key(f"{experiment}/{trial}/_health/{role}/{index}")
