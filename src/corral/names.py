"""What a valid role, experiment or trial name is (each is a part of name-resolve keys,
log paths and Slurm job names). Its own module, light to import: a worker checks the
role of each child it forks without loading ``corral.spec`` (dataclasses, typing)."""

from __future__ import annotations

import re

from corral.errors import ConfigError

ROLE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def validate_role_name(role: object, field_name: str = "job.role") -> str:
    """``role`` if it is a valid name, else ConfigError naming ``field_name``."""
    if not isinstance(role, str) or not ROLE_RE.fullmatch(role) or ".." in role:
        raise ConfigError(
            field_name,
            role,
            "use 1-64 characters of letters, digits, '_', '-' or '.', starting with a letter "
            "or digit (no '/', ':', '..' or spaces)",
        )
    return role
