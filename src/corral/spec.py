"""What users declare: workers, jobs, resources and placement. Validated before anything starts."""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any

from corral.errors import ConfigError, EngineTypeError, JobConfigError, UnknownRoleError
from corral.names import validate_role_name  # noqa: F401  (importable from here too)

STRATEGY_TYPES = ("separation", "colocation")
RAY_PLACEMENT_STRATEGIES = ("shared", "separate", "deferred")
CONTAINER_TYPES = ("none", "apptainer")
TASK_TYPES = ("worker", "engine")


@dataclass
class SchedulingSpec:
    """Resources and launch details of one worker (one replica of a role).

    ``mem`` is in GiB. ``port_count`` is the number of ports in ``Worker.worker_ports``:
    the port the worker serves on, then ``port_count - 1`` free ports reserved on its host
    (at least one, rank 0's is ``MASTER_PORT``). ``engines`` maps engine names to import
    paths of engines the worker creates before it reports ready. ``task_type`` (``worker``
    or ``engine``) is AReaL's label, kept and validated; corral starts both the same way.
    ``cmd`` replaces ``python -m corral.worker``; see docs/areal.md for the arguments it gets.

    Heterogeneous resources (docs/shapes.md): ``partition``, ``constraint``,
    ``reservation`` and ``exclusive`` become the Slurm job's ``--partition``,
    ``--constraint``, ``--reservation`` and ``--exclusive`` (a spec's partition wins over
    the scheduler's); ``ray_resources`` (custom resource -> amount per worker) and
    ``accelerator_type`` (Ray's ``accelerator_type:<T>`` node resource) go into the Ray
    bundle. Each backend ignores the other's fields. ``gpu`` may be a whole number of
    nodes (``k * n_gpus_per_node``) on Ray and Slurm: a multi-node instance.
    ``ray_placement_strategy`` is deprecated in AReaL main (``None`` there); None here
    means ``"separate"``, and the Ray backend still honours the other values.
    """

    cpu: int = 1
    gpu: int = 0
    mem: int = 1
    port_count: int = 2
    env_vars: dict[str, str] = field(default_factory=dict)
    cmd: str | None = None
    container_type: str = "none"
    image: str | None = None
    mount: str | None = None
    nodelist: str | None = None
    exclude: str | None = None
    srun_additional_args: str = ""
    additional_bash_cmds: list[str] = field(default_factory=list)
    ray_placement_strategy: str | None = "separate"
    max_restarts: int = 0
    engines: dict[str, str] = field(default_factory=dict)
    task_type: str = "worker"
    reservation: str | None = None
    exclusive: bool = False
    partition: str | None = None
    constraint: str | None = None
    ray_resources: dict[str, float] = field(default_factory=dict)
    accelerator_type: str | None = None

    def __post_init__(self) -> None:
        if self.additional_bash_cmds is None:
            self.additional_bash_cmds = []
        if self.ray_placement_strategy is None:  # AReaL main's default: deprecated, unset
            self.ray_placement_strategy = "separate"
        if self.ray_resources is None:
            self.ray_resources = {}
        validate_spec(self)


class SchedulingStrategyType(str, enum.Enum):  # noqa: UP042 (AReaL's base classes)
    """The placement kinds (AReaL's enum): a member compares equal to its name."""

    separation = "separation"
    colocation = "colocation"


@dataclass
class SchedulingStrategy:
    """How a role is placed relative to other roles.

    ``separation``: the role gets its own resources. ``colocation``: the role lives on
    the workers of ``target``; with ``fork=True`` (the default, as in AReaL) each target
    worker forks a new worker process next to itself, with ``fork=False`` the target's
    workers are reused as they are. ``type`` may be a :class:`SchedulingStrategyType`.
    A colocation without a target is refused by ``create_workers``.
    """

    type: str = "separation"
    target: str | None = None
    fork: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.type, SchedulingStrategyType):
            self.type = self.type.value
        if self.type not in STRATEGY_TYPES:
            raise ConfigError(
                "scheduling_strategy.type", self.type, f"use one of {', '.join(STRATEGY_TYPES)}"
            )
        if self.target:
            validate_role_name(self.target, "scheduling_strategy.target")


class DefaultTasks(list):
    """The empty ``Job.tasks`` default. It equals ``[]`` as in AReaL, but unlike an
    explicit ``tasks=[]`` (refused: "No scheduling specs") it means "the default spec"."""


@dataclass
class Job:
    """A role to run: ``replicas`` workers, each with one of ``tasks`` (one spec for all
    replicas, or one per replica; empty: the default spec). Defaults as in AReaL:
    ``replicas=0`` is refused by ``create_workers``, so say how many."""

    role: str
    replicas: int = 0
    tasks: list[SchedulingSpec] = field(default_factory=lambda: DefaultTasks())
    scheduling_strategy: SchedulingStrategy = field(default_factory=SchedulingStrategy)


@dataclass
class Worker:
    """A reachable worker process.

    The first four fields are AReaL's ``Worker``: ``id`` (``role/index``), ``ip``,
    ``worker_ports`` (strings; ``worker_ports[0]`` is the port the worker serves on, the
    rest are free ports reserved on its host) and ``engine_ports`` (ports engines
    announced; empty unless an engine reports some). The rest are corral's.
    """

    id: str
    ip: str
    worker_ports: list[str] = field(default_factory=list)
    engine_ports: list[str] = field(default_factory=list)
    role: str = ""
    index: int = -1
    port: int = 0
    host: str = ""
    pid: int | None = None
    backend_id: str | None = None
    forked: bool = False
    generation: str = ""
    foreign: bool = False
    """A foreign server (its own HTTP API, ready by GET /health; see corral.foreign)."""
    member_hosts: list[str] = field(default_factory=list)
    """A multi-node instance's other nodes (corral.multinode; ``Scheduler.instance``)."""

    def __post_init__(self) -> None:
        role, _, index = self.id.rpartition("/")
        if not self.role:
            self.role = role
        if self.index < 0 and index.isdigit():
            self.index = int(index)
        self.worker_ports = [str(p) for p in self.worker_ports]
        self.engine_ports = [str(p) for p in self.engine_ports]
        if not self.port and self.worker_ports:
            self.port = int(self.worker_ports[0])
        elif self.port and not self.worker_ports:
            self.worker_ports = [str(self.port)]

    @classmethod
    def from_registration(
        cls, role: str, index: int, address: str, info: dict, **fields: Any
    ) -> Worker:
        """A worker from what it published: ``ip:port`` and its info record (pid, host,
        reserved ports, generation); ``fields`` override or fill in the rest."""
        ip, _, port = address.rpartition(":")
        extra = [str(p) for p in info.get("worker_ports", [])]
        if extra[:1] != [port]:
            extra.insert(0, port)
        values = {
            "worker_ports": extra,
            "engine_ports": [str(p) for p in info.get("engine_ports", [])],
            "host": info.get("host", ""),
            "pid": info.get("pid"),
            "backend_id": info.get("backend_id"),
            "forked": bool(info.get("forked", False)),
            "generation": info.get("generation", ""),
        }
        values.update(fields)
        return cls(id=f"{role}/{index}", role=role, index=index, ip=ip, port=int(port), **values)

    @property
    def reserved_ports(self) -> list[int]:
        """The free ports reserved for this worker (``worker_ports`` after the served one)."""
        return [int(p) for p in self.worker_ports[1:]]

    @property
    def address(self) -> str:
        return f"{self.ip}:{self.port}"

    @property
    def identity(self) -> str | None:
        """``id#generation``: what the worker at ``address`` must be to accept a call."""
        return f"{self.id}#{self.generation}" if self.generation else None


def _check_count(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(name, value, f"use a whole number >= {minimum}")


def validate_spec(spec: SchedulingSpec, prefix: str = "SchedulingSpec") -> None:
    _check_count(f"{prefix}.cpu", spec.cpu, 0)
    _check_count(f"{prefix}.gpu", spec.gpu, 0)
    _check_count(f"{prefix}.mem", spec.mem, 0)
    _check_count(f"{prefix}.port_count", spec.port_count, 0)
    _check_count(f"{prefix}.max_restarts", spec.max_restarts, 0)
    if spec.task_type not in TASK_TYPES:
        raise ConfigError(
            f"{prefix}.task_type", spec.task_type, f"use one of {', '.join(TASK_TYPES)}"
        )
    if spec.container_type not in CONTAINER_TYPES:
        raise ConfigError(
            f"{prefix}.container_type",
            spec.container_type,
            f"use one of {', '.join(CONTAINER_TYPES)}",
        )
    if spec.container_type == "apptainer" and not spec.image:
        raise ConfigError(
            f"{prefix}.image", spec.image, "container_type='apptainer' needs image=<path to .sif>"
        )
    if spec.ray_placement_strategy not in RAY_PLACEMENT_STRATEGIES:
        raise ConfigError(
            f"{prefix}.ray_placement_strategy",
            spec.ray_placement_strategy,
            f"use one of {', '.join(RAY_PLACEMENT_STRATEGIES)}",
        )
    from corral.resources import validate_resource_fields

    validate_resource_fields(spec, prefix)
    if not isinstance(spec.env_vars, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in spec.env_vars.items()
    ):
        raise ConfigError(f"{prefix}.env_vars", spec.env_vars, "use a dict of str to str")
    from corral.stop_deadline import STOP_DEADLINE_ENV, check_stop_deadline

    check_stop_deadline(spec.env_vars, f"{prefix}.env_vars[{STOP_DEADLINE_ENV!r}]")
    if not isinstance(spec.engines, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in spec.engines.items()
    ):
        raise ConfigError(
            f"{prefix}.engines", spec.engines, "use a dict of engine name to import path"
        )


@dataclass(frozen=True)
class NormalizedJob:
    """A job after validation: every field present, one spec per replica."""

    role: str
    replicas: int
    tasks: tuple[SchedulingSpec, ...]
    strategy: SchedulingStrategy

    @property
    def is_colocated(self) -> bool:
        return self.strategy.type == "colocation"

    @property
    def total_gpus(self) -> int:
        return sum(t.gpu for t in self.tasks)


def _as_strategy(value: Any) -> SchedulingStrategy:
    if value is None:
        return SchedulingStrategy()
    if isinstance(value, SchedulingStrategy):
        return value
    if isinstance(value, dict):
        return SchedulingStrategy(**value)
    return SchedulingStrategy(
        type=getattr(value, "type", "separation"),
        target=getattr(value, "target", None),
        fork=bool(getattr(value, "fork", True)),
    )


def _as_spec(value: Any, index: int) -> SchedulingSpec:
    if isinstance(value, SchedulingSpec):
        validate_spec(value, f"job.tasks[{index}]")
        return value
    if isinstance(value, dict):
        try:
            return SchedulingSpec(**value)
        except TypeError as exc:
            raise ConfigError(f"job.tasks[{index}]", value, f"unknown field ({exc})") from None
    if dataclasses.is_dataclass(value):
        return _as_spec(dataclasses.asdict(value), index)
    raise ConfigError(f"job.tasks[{index}]", value, "use a corral.SchedulingSpec")


def normalize_job(job: Any) -> NormalizedJob:
    """Check any object with ``role``, ``replicas``, ``tasks`` and ``scheduling_strategy``.

    Refusals are :class:`JobConfigError` (a ``ConfigError`` and a ``WorkerCreationError``);
    their messages keep the phrases AReaL's errors use for the same input."""
    for attr in ("role", "replicas"):
        if not hasattr(job, attr):
            raise ConfigError(
                f"job.{attr}", None, "a job needs role, replicas, tasks and scheduling_strategy"
            )
    role = validate_role_name(job.role)
    replicas = job.replicas
    if isinstance(replicas, int) and not isinstance(replicas, bool) and replicas == 0:
        raise JobConfigError(
            "job.replicas", 0, "replicas must be greater than 0; say how many workers", role
        )
    _check_count("job.replicas", replicas, 1)
    raw_tasks = getattr(job, "tasks", None)
    if raw_tasks is None or isinstance(raw_tasks, DefaultTasks) and not raw_tasks:
        raw_tasks = [SchedulingSpec()]
    elif isinstance(raw_tasks, SchedulingSpec | dict):
        raw_tasks = [raw_tasks]
    raw_tasks = list(raw_tasks)
    if not raw_tasks:
        raise JobConfigError(
            "job.tasks",
            [],
            "No scheduling specs given; pass one SchedulingSpec (used for every replica), "
            "one per replica, or leave tasks out for the default spec",
            role,
        )
    if len(raw_tasks) == 1:
        raw_tasks = raw_tasks * replicas
    if len(raw_tasks) != replicas:
        n = len(raw_tasks)
        raise JobConfigError(
            "job.tasks",
            f"{n} specs",
            f"schedulings length ({n}) must be 1 or equal to replicas ({replicas}): the "
            f"number of specs must be 1 or match replicas; give 1 spec (used for every "
            f"replica) or exactly replicas={replicas} specs",
            role,
        )
    tasks = tuple(_as_spec(t, i) for i, t in enumerate(raw_tasks))
    strategy = _as_strategy(getattr(job, "scheduling_strategy", None))
    if strategy.type == "colocation" and not strategy.target:
        raise UnknownRoleError(
            "scheduling_strategy.target",
            strategy.target,
            "Colocation strategy requires target=<role> naming the role to colocate with",
            role,
        )
    if strategy.target == role:
        raise JobConfigError(
            "scheduling_strategy.target",
            strategy.target,
            "a role cannot colocate with itself",
            role,
        )
    return NormalizedJob(role=role, replicas=replicas, tasks=tasks, strategy=strategy)


def engine_import_path(engine: Any) -> str:
    """The import path a worker creates ``engine`` from (a path, or a class of a module)."""
    if isinstance(engine, str):
        return engine
    if isinstance(engine, type):
        if engine.__module__ == "__main__":
            raise ConfigError(
                "engine",
                engine.__qualname__,
                "define the engine class in an importable module, not in __main__",
            )
        return f"{engine.__module__}:{engine.__qualname__}"
    raise EngineTypeError(
        "engine",
        engine,
        "Engine must be a string import path 'pkg.module.Class' (or the class itself)",
    )
