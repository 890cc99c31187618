"""Reading config files that hold more than corral owns.

An AReaL config file carries sections corral never reads (``actor``, ``rollout``,
``gconfig``, ``train_dataset``, ...) and a few fields in the sections it shares with
corral (``scheduler.endpoint``, ``cluster.name_resolve.ray_actor_name``). corral accepts
them: unknown top-level sections of an experiment config (a class with an ``extra``
field, such as ``BaseExperimentConfig``) are kept in ``cfg.extra`` for the user's code,
and AReaL's own fields of the shared sections are ignored. A key that is one typo away
from a field corral owns (``schedular``, ``experiment_nmae``) is still an error, and so
is any unknown key inside a section corral owns.
"""

from __future__ import annotations

import difflib
from typing import Any

from corral.errors import ConfigError

#: Fields AReaL 1.0.4 defines in the config sections corral shares with it, which corral
#: does not use: accepted and ignored (never an error), by corral class name.
AREAL_ONLY_FIELDS: dict[str, frozenset[str]] = {
    "NameResolveConfig": frozenset({"ray_actor_name"}),
    "SchedulerConfig": frozenset(
        {
            "endpoint",
            "deploy_mode",
            "functioncall_service_domain",
            "reward_functioncall_config",
            "reward_model_path",
            "reward_model_service_url",
        }
    ),
}
EXTRA_FIELD = "extra"
TYPO_CUTOFF = 0.8  # difflib ratio from which an unknown key is taken for a misspelt field


def near_miss(key: str, names: set[str]) -> str | None:
    """The field ``key`` most likely misspells, or None."""
    found = difflib.get_close_matches(key, sorted(names), n=1, cutoff=TYPO_CUTOFF)
    return found[0] if found else None


def set_aside_unowned(cls: type, data: dict, names: set[str], path: str) -> dict:
    """``data`` without the keys corral accepts but does not own: AReaL's own fields of a
    shared section are dropped; unknown top-level sections of an experiment config go to
    its ``extra``. Raises ConfigError for a key that looks like a misspelt field."""
    ignored = AREAL_ONLY_FIELDS.get(cls.__name__, frozenset())
    if cls.__module__ == "corral.config" and ignored:
        data = {k: v for k, v in data.items() if k not in ignored or k in names}
    if EXTRA_FIELD not in names:
        return data
    unknown = [k for k in data if k not in names]
    if not unknown:
        return data
    owned = names - {EXTRA_FIELD}
    for key in unknown:
        match = near_miss(str(key), owned)
        if match is not None:
            raise ConfigError(
                f"{path}.{key}",
                data[key],
                f"did you mean {match!r}? (a key this close to a field corral reads is taken "
                "for a typo; sections corral does not own are kept in cfg.extra)",
            )
    kept = dict(data.get(EXTRA_FIELD) or {})
    kept.update({k: data[k] for k in unknown})
    data = {k: v for k, v in data.items() if k in names}
    data[EXTRA_FIELD] = kept
    return data


def read_yaml_file(path: str) -> dict:
    """A YAML file's top-level mapping; a syntax error is a ConfigError naming the file,
    the line and the column."""
    import yaml

    try:
        with open(path) as fh:
            loaded = yaml.safe_load(fh) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(
            "config file", path, f"it is not valid YAML: {_yaml_problem(exc)}"
        ) from None
    except OSError as exc:
        raise ConfigError("config file", path, f"it cannot be read ({exc.strerror})") from None
    if not isinstance(loaded, dict):
        raise ConfigError("config file", path, "its top level must be a mapping")
    return loaded


def parse_override_value(override: str, raw: str) -> Any:
    """The value of ``key=raw``, read as YAML (``1`` is an int, ``[1, 2]`` a list)."""
    import yaml

    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise ConfigError(
            "override", override, f"its value is not valid YAML ({_yaml_problem(exc)}); quote it"
        ) from None


def _yaml_problem(exc: Exception) -> str:
    """One line: what PyYAML found wrong and where (line and column count from 1)."""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    mark = getattr(exc, "problem_mark", None)
    if mark is not None:
        return f"{problem} at line {mark.line + 1}, column {mark.column + 1}; fix the syntax there"
    return f"{problem}; fix the syntax"
