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


def controller_key(experiment: str, trial: str) -> str:
    """The controller's lease: a heartbeat that changes every second while it lives."""
    return check_key(f"{experiment}/{trial}/_controller")
