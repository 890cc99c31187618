"""Name-resolve records for the live view, each verified with its trial's secret.

Whoever can write to the store (a shared record directory, an etcd without
authentication, Ray's GCS) can put anything there. The views (``corral top --etcd``, the
dashboard's "registered" trials, the per-worker CPU/memory figures) therefore show a
record only when it carries the signature of its trial's secret (``corral.auth``); the
others are counted and named in a note, never shown as a worker, a host or a figure.
"""

from __future__ import annotations

from corral.auth import TrialKeys, open_record
from corral.discovery import NameResolve
from corral.errors import ConfigError
from corral.paths import secret_file
from corral.spec import validate_role_name

MAX_NAMED = 3  # refused keys named in a note (the rest are counted)


def trial_keys(fileroot: str, experiment: str, trial: str) -> TrialKeys | None:
    """The record keys of a trial, from its secret file under ``fileroot``; None when the
    names are not valid trial names (a forged key) or there is no secret to read."""
    try:
        validate_role_name(experiment, "experiment")
        validate_role_name(trial, "trial")
        with open(secret_file(fileroot, experiment, trial)) as fh:
            secret = fh.read().strip()
    except (ConfigError, OSError, UnicodeDecodeError):
        return None
    return TrialKeys(secret) if secret else None


def verified(keys: TrialKeys | None, records: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """(key -> value of each record signed with ``keys``, the keys of the others)."""
    good: dict[str, str] = {}
    refused: list[str] = []
    for key, stored in records.items():
        value = None if keys is None else open_record(keys, key, stored)
        if value is None:
            refused.append(key)
        else:
            good[key] = value
    return good, sorted(refused)


def verified_subtree(
    store: NameResolve, keys: TrialKeys, prefix: str
) -> tuple[dict[str, str], list[str]]:
    """The records under ``prefix`` of the raw ``store`` (not a ``SignedNameResolve``,
    whose listing fails whole on one forged record), split as :func:`verified` does."""
    return verified(keys, store.get_subtree(prefix))


def refused_note(refused: list[str]) -> str | None:
    """One line naming the refused records (shown inert by the views), or None."""
    if not refused:
        return None
    named = ", ".join(refused[:MAX_NAMED])
    more = f" and {len(refused) - MAX_NAMED} more" if len(refused) > MAX_NAMED else ""
    return (
        f"{len(refused)} name-resolve record(s) not signed with this trial's secret were "
        f"not shown ({named}{more}): someone else can write to this store"
    )
