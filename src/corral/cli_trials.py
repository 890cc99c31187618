"""Which trials exist under a fileroot, for the ``corral`` commands that take one.

A trial is known when anything of it is left: its logs, its private directory (secret,
stats file) or its records in name-resolve. A command given an unknown trial says so and
lists the known ones (exit 2) instead of acting on nothing.
"""

from __future__ import annotations

import os

from corral.errors import ConfigError
from corral.paths import logs_root

MAX_LISTED = 12


def _pairs_under(root: str) -> set[tuple[str, str]]:
    """(experiment, trial) for each ``root/<experiment>/<trial>`` directory."""
    found: set[tuple[str, str]] = set()
    try:
        experiments = os.listdir(root)
    except OSError:
        return found
    for exp in experiments:
        try:
            trials = os.listdir(os.path.join(root, exp))
        except OSError:
            continue
        found.update((exp, t) for t in trials if os.path.isdir(os.path.join(root, exp, t)))
    return found


def known_trials(fileroot: str, registered: set[tuple[str, str]] = frozenset()) -> set:
    """Every (experiment, trial) with logs, a private directory, or name-resolve records
    (``registered``, read by the caller from the name-resolve it uses)."""
    return (
        _pairs_under(logs_root(fileroot))
        | _pairs_under(os.path.join(fileroot, "secrets"))
        | set(registered)
    )


def listing(trials: set[tuple[str, str]]) -> str:
    if not trials:
        return "none"
    names = [f"{e}/{t}" for e, t in sorted(trials)]
    more = len(names) - MAX_LISTED
    return ", ".join(names[:MAX_LISTED]) + (f" (and {more} more)" if more > 0 else "")


def require_trial(
    fileroot: str, experiment: str, trial: str, registered: set[tuple[str, str]] = frozenset()
) -> None:
    """ConfigError (exit 2) listing the known trials, unless ``experiment/trial`` is one."""
    known = known_trials(fileroot, registered)
    if (experiment, trial) in known:
        return
    same_exp = {k for k in known if k[0] == experiment}
    raise ConfigError(
        "trial",
        f"{experiment}/{trial}",
        f"no such trial under {fileroot}; known: {listing(same_exp or known)}",
    )


def pick_log_trial(fileroot: str, experiment: str | None, trial: str | None) -> tuple[str, str]:
    """The trial ``corral logs`` shows: the one named, else the newest of the experiment
    named (or of all), by the time its log directory last changed. Never a trial of
    another experiment."""
    root = logs_root(fileroot)
    have = _pairs_under(root)
    if experiment and trial:
        if (experiment, trial) not in have:
            same = {k for k in have if k[0] == experiment}
            raise ConfigError(
                "trial",
                f"{experiment}/{trial}",
                f"no logs of it under {root}; trials with logs: {listing(same or have)}",
            )
        return experiment, trial
    candidates = {k for k in have if experiment in (None, k[0]) and trial in (None, k[1])}
    if not candidates:
        what = f"experiment {experiment!r}" if experiment else f"trial {trial!r}"
        if not (experiment or trial):
            raise ConfigError("logs", root, "no trial has logs there; check --fileroot")
        raise ConfigError(
            "--experiment" if experiment else "--trial",
            experiment or trial,
            f"no logs of {what} under {root}; trials with logs: {listing(have)}",
        )
    return max(candidates, key=lambda k: os.path.getmtime(os.path.join(root, *k)))
