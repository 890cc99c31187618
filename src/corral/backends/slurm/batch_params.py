"""What the batch script of one role depends on (:class:`SbatchParams`), and the checks
of each value before it is rendered (names, paths, environment, container, signal)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from corral.backends.backend_options import SlurmOptions
from corral.backends.slurm.layout import SlurmLayout, plan_layout
from corral.errors import ConfigError
from corral.spec import SchedulingSpec
from corral.worker import env as E

# Environment the renderer owns (names from corral.worker.env, the contract's one owner);
# users cannot override these through SchedulingSpec.env_vars or SbatchParams.env.
# CORRAL_SECRET is refused so that the trial secret never lands in a job script: pass
# secret_file instead.
RESERVED_ENV = frozenset(
    {
        E.EXPERIMENT,
        E.TRIAL,
        E.ROLE,
        E.NAME_RESOLVE,
        E.SECRET_FILE,
        E.INDEX_OFFSET,
        E.LEASE_TIMEOUT,
        E.PORT_COUNT,
        E.LOG_DIR,
        E.BACKEND_ID,
        E.INDEX,
        E.SECRET,
    }
)

_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def check_container(spec_or_params: SchedulingSpec | SbatchParams) -> None:
    """For apptainer specs, check that the image file exists on this host (the only I/O)."""
    if isinstance(spec_or_params, SbatchParams):
        container_type, image = spec_or_params.resolved_container()[:2]
    else:
        container_type, image = spec_or_params.container_type, spec_or_params.image
    if container_type != "apptainer":
        return
    if not image or not os.path.exists(image):
        raise ConfigError(
            "SchedulingSpec.image",
            image,
            "no such file: give the path of an existing apptainer image (.sif) on a "
            "filesystem the compute nodes share",
        )


# ----------------------------------------------------------------- parameters --
@dataclass(frozen=True)
class SbatchParams:
    """Everything the batch script of one role depends on.

    ``nodelist``, ``exclude``, ``container_type``, ``image`` and ``mount`` override the
    spec's fields of the same name when not None. ``env`` may repeat or override the
    CORRAL_* values rendered from the fields here (so a scheduler can pass its common
    worker environment as is), but never CORRAL_SECRET (use ``secret_file``) or
    CORRAL_INDEX (per task: ``CORRAL_INDEX_OFFSET + SLURM_PROCID``), and CORRAL_ROLE
    must match ``role``. The spec's ``env_vars`` come last and win, but may not set any
    of :data:`RESERVED_ENV`. ``log_dir`` must be absolute and exist before submission
    (Slurm opens the sbatch log there before the script runs).
    """

    job_name: str
    role: str
    replicas: int
    spec: SchedulingSpec
    n_gpus_per_node: int
    log_dir: str
    experiment: str
    trial: str
    name_resolve: str | Mapping[str, object]
    """JSON text (or a mapping, dumped to JSON) for CORRAL_NAME_RESOLVE."""
    secret_file: str
    python: str = "python3"
    env: Mapping[str, str] = field(default_factory=dict)
    index_offset: int = 0
    lease_timeout: float = E.DEFAULT_LEASE_TIMEOUT
    options: SlurmOptions = field(default_factory=SlurmOptions)
    """partition, account, qos, time, extra sbatch/srun arguments, and overrides of the
    spec's nodelist, exclude, container type and mounts (checked at rendering)."""
    image: str | None = None
    apptainer: str = "apptainer"
    n_cpus_per_node: int | None = None
    mem_per_node_gb: int | None = None
    requeue: bool = False
    """Opt-in preemption: ``--requeue`` (Slurm may preempt and requeue the job) instead
    of ``--no-requeue``."""
    signal: str | None = None
    """``--signal`` value, e.g. ``"USR1@60"``: warn the workers before the time limit."""

    def resolved_container(self) -> tuple[str, str | None, str | None]:
        """(container_type, image, mount) after applying the overrides."""
        s = self.spec
        o = self.options
        ctype = o.container_type if o.container_type is not None else s.container_type
        image = self.image if self.image is not None else s.image
        mount = o.container_mounts if o.container_mounts is not None else s.mount
        return ctype, image, mount

    def layout(self) -> SlurmLayout:
        return plan_layout(
            self.replicas,
            self.spec,
            self.n_gpus_per_node,
            n_cpus_per_node=self.n_cpus_per_node,
            mem_per_node_gb=self.mem_per_node_gb,
        )


# ------------------------------------------------------------------ checking --
def directive_value(name: str, value: object) -> str:
    """A value for an ``#SBATCH --x=value`` line: one word, no newline."""
    text = str(value)
    if not text or any(c.isspace() for c in text):
        raise ConfigError(name, value, "use a non-empty value without spaces or newlines")
    return text


def check_path(name: str, value: str) -> str:
    if not isinstance(value, str) or not value.startswith("/"):
        raise ConfigError(name, value, "use an absolute path on the shared filesystem")
    if any(c.isspace() for c in value) or "%" in value:
        raise ConfigError(
            name, value, "use a path without spaces or '%' (Slurm reads '%' as a pattern)"
        )
    return value


def check_env(name: str, env: Mapping[str, str], *, allow_corral: bool) -> dict[str, str]:
    """Names and values of an env mapping. CORRAL_SECRET and CORRAL_INDEX are refused
    everywhere; the other reserved CORRAL_* names only where ``allow_corral`` is False."""
    if not isinstance(env, Mapping):
        raise ConfigError(name, env, "use a dict of str to str")
    out: dict[str, str] = {}
    for key, value in env.items():
        if not isinstance(key, str) or not _ENV_NAME_RE.match(key):
            raise ConfigError(f"{name}[{key!r}]", value, "use a shell variable name")
        if not isinstance(value, str):
            raise ConfigError(f"{name}[{key!r}]", value, "use a str value")
        if key == E.SECRET:
            raise ConfigError(
                f"{name}[{key!r}]",
                "<hidden>",
                "pass the trial secret as secret_file, never in the script",
            )
        if key == E.INDEX:
            raise ConfigError(
                f"{name}[{key!r}]",
                value,
                "remove it: each task's script sets it to "
                "CORRAL_INDEX_OFFSET + SLURM_PROCID (set index_offset instead)",
            )
        if key in RESERVED_ENV and not allow_corral:
            raise ConfigError(
                f"{name}[{key!r}]", value, "corral sets this variable itself; remove it"
            )
        out[key] = value
    return out


def name_resolve_json(value: str | Mapping[str, object]) -> str:
    if isinstance(value, Mapping):
        return json.dumps(dict(value), sort_keys=True)
    if isinstance(value, str):
        try:
            json.loads(value)
        except ValueError:
            raise ConfigError(
                "name_resolve", value, "use the JSON text of the name-resolve config"
            ) from None
        return value
    raise ConfigError("name_resolve", value, "use a JSON string or a dict")


SIGNAL_RE = re.compile(r"^(?:[RB]:)?(?:SIG)?[A-Z0-9]+(?:@\d+)?$")
