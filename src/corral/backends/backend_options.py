"""Each backend's own options as one typed dataclass, validated once.

This is the only place the option names, defaults and checks are written: the config
(``scheduler.ray`` / ``scheduler.slurm``), the schedulers' keywords, the Slurm launcher
and the sbatch renderer all read these classes. Older flat keys (``scheduler.partition``,
``scheduler.ray_address``) are still read, into their section.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from dataclasses import dataclass, field
from typing import Any, ClassVar

from corral.errors import ConfigError

_TIME_RE = re.compile(r"^(?:\d+-)?\d+(?::\d+){0,2}$|^(?:UNLIMITED|INFINITE)$", re.IGNORECASE)


def section_value(section: Any, name: str) -> Any:
    """``section.name`` of a config object or dict (None if absent)."""
    if section is None:
        return None
    if isinstance(section, dict):
        return section.get(name)
    return getattr(section, name, None)


class _Options:
    SECTION: ClassVar[str]
    LEGACY: ClassVar[dict[str, str]]
    """Old flat ``scheduler.<key>`` -> the option it now is."""

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]

    @classmethod
    def resolve(cls, exp_config: Any = None, **given: Any) -> Any:
        """Keywords (not None) win over ``cfg.scheduler.<section>.<name>``, which wins
        over an old flat ``cfg.scheduler.<key>``; then the defaults. Checked once here."""
        unknown = sorted(set(given) - set(cls.names()))
        if unknown:
            raise ConfigError(
                unknown[0], given[unknown[0]], f"{cls.__name__} has options {cls.names()}"
            )
        sched = getattr(exp_config, "scheduler", None)
        if sched is None and isinstance(exp_config, dict):
            sched = exp_config.get("scheduler")
        section = section_value(sched, cls.SECTION)
        if isinstance(section, cls):
            values = dataclasses.asdict(section)  # type: ignore[call-overload]
        else:
            values = {name: section_value(section, name) for name in cls.names()}
        for legacy, name in cls.LEGACY.items():
            old = section_value(sched, legacy)
            if old not in (None, "", [], ()) and values.get(name) in (None, "", [], ()):
                values[name] = old
        values.update({k: v for k, v in given.items() if v is not None})
        defaults = cls()
        values = {k: (getattr(defaults, k) if v is None else v) for k, v in values.items()}
        return cls(**values).checked()

    def checked(self) -> Any:
        return self


def _one_word(name: str, value: Any) -> None:
    if value is None:
        return
    text = str(value)
    if not text or any(c.isspace() for c in text):
        raise ConfigError(name, value, "use a non-empty value without spaces or newlines")


@dataclass
class SlurmOptions(_Options):
    """How a role's batch job is submitted (``SlurmScheduler``).

    ``nodelist``/``exclude``/``container_type``/``container_mounts``: when set, they
    replace every role's ``SchedulingSpec`` fields of the same meaning."""

    SECTION: ClassVar[str] = "slurm"
    LEGACY: ClassVar[dict[str, str]] = {
        "partition": "partition",
        "account": "account",
        "qos": "qos",
        "time_limit": "time_limit",
        "sbatch_directives": "sbatch_directives",
        "srun_args": "srun_args",
    }

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time_limit: str | int | None = None
    """Slurm ``--time``: minutes (int) or e.g. "30", "4:00:00", "1-12:00:00"."""
    sbatch_directives: list[str] = field(default_factory=list)
    """Extra sbatch options, one per entry, e.g. "--reservation=x"."""
    srun_args: list[str] | str = field(default_factory=list)
    """Extra srun arguments: one word per entry, or one string split like a shell."""
    nodelist: str | None = None
    exclude: str | None = None
    container_type: str | None = None
    container_mounts: str | None = None

    def checked(self) -> SlurmOptions:
        """Names the option, the value and the fix of the first bad one; normalizes
        ``srun_args`` to a list of words."""
        for name in ("partition", "account", "qos", "nodelist", "exclude"):
            _one_word(name, getattr(self, name))
        if self.time_limit is not None:
            value = self.time_limit
            ok = (isinstance(value, int) and not isinstance(value, bool) and value > 0) or (
                isinstance(value, str) and _TIME_RE.match(value)
            )
            if not ok:
                raise ConfigError(
                    "time_limit",
                    value,
                    'use minutes (int) or a Slurm time such as "30", "4:00:00" or "1-12:00:00"',
                )
        if isinstance(self.sbatch_directives, str):
            self.sbatch_directives = [self.sbatch_directives]
        for i, extra in enumerate(self.sbatch_directives):
            if not isinstance(extra, str) or not extra.startswith("-") or "\n" in extra:
                raise ConfigError(
                    f"sbatch_directives[{i}]",
                    extra,
                    'use one sbatch option per entry, e.g. "--reservation=x"',
                )
        words = self.srun_args
        if isinstance(words, str):
            try:
                words = shlex.split(words)
            except ValueError as exc:
                raise ConfigError("srun_args", self.srun_args, str(exc)) from None
        for arg in words:
            if not isinstance(arg, str):
                raise ConfigError("srun_args", arg, "use a list of str, one word each")
        self.srun_args = list(words)
        self.sbatch_directives = [d.strip() for d in self.sbatch_directives]
        return (
            self  # container_type is checked with the spec's (corral.backends.slurm.batch_script)
        )


@dataclass
class RayOptions(_Options):
    """How ``RayScheduler`` joins or starts a Ray runtime.

    ``address``: the cluster to join (else the runtime of this process, ``RAY_ADDRESS``,
    one running on this machine, or a new local one); ``init_kwargs`` go to ``ray.init``;
    ``reserve_memory`` puts a spec's ``mem`` into its placement bundle."""

    SECTION: ClassVar[str] = "ray"
    LEGACY: ClassVar[dict[str, str]] = {"ray_address": "address"}

    address: str | None = None
    init_kwargs: dict[str, Any] = field(default_factory=dict)
    reserve_memory: bool = False

    def checked(self) -> RayOptions:
        if self.address is not None and not isinstance(self.address, str):
            raise ConfigError("address", self.address, 'use "host:port", "auto" or "local"')
        if not isinstance(self.init_kwargs, dict):
            raise ConfigError("init_kwargs", self.init_kwargs, "use a dict of ray.init keywords")
        if not isinstance(self.reserve_memory, bool):
            raise ConfigError("reserve_memory", self.reserve_memory, "use True or False")
        return self


def legacy_keys() -> dict[str, tuple[str, str]]:
    """Old flat ``scheduler`` key -> (section, option), for configs read from files."""
    keys: dict[str, tuple[str, str]] = {}
    for options in (RayOptions, SlurmOptions):
        for legacy, name in options.LEGACY.items():
            keys[legacy] = (options.SECTION, name)
    return keys
