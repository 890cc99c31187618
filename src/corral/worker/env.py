"""The contract between a launcher and ``python -m corral.worker``: environment variables."""

from __future__ import annotations

import _socket  # socket's C module: socket.py loads enum (a worker's start)
import os
from collections import namedtuple

from corral import cjson  # json's C codec without json and re (a worker's start)

EXPERIMENT = "CORRAL_EXPERIMENT"
TRIAL = "CORRAL_TRIAL"
ROLE = "CORRAL_ROLE"
INDEX = "CORRAL_INDEX"
INDEX_OFFSET = "CORRAL_INDEX_OFFSET"
NAME_RESOLVE = "CORRAL_NAME_RESOLVE"
SECRET = "CORRAL_SECRET"  # never set: refused by the worker and by the sbatch renderer
SECRET_FILE = "CORRAL_SECRET_FILE"
SECRET_FD = "CORRAL_SECRET_FD"
ENGINE_ALLOW = "CORRAL_ENGINE_ALLOW"
LOG_DIR = "CORRAL_LOG_DIR"
PORT_COUNT = "CORRAL_PORT_COUNT"
LEASE_TIMEOUT = "CORRAL_LEASE_TIMEOUT"
CONTROLLER_PID = "CORRAL_CONTROLLER_PID"
CONTROLLER_HOST = "CORRAL_CONTROLLER_HOST"
DIE_WITH_PARENT = "CORRAL_DIE_WITH_PARENT"
BIND_HOST = "CORRAL_BIND_HOST"
ADVERTISE_HOST = "CORRAL_ADVERTISE_HOST"
BACKEND_ID = "CORRAL_BACKEND_ID"
OUTLIVE = "CORRAL_OUTLIVE"  # seconds workers outlive their controller (corral.controller.adoption)
FORKED = "CORRAL_FORKED"
ENGINES = "CORRAL_ENGINES"
FILEROOT = "CORRAL_FILEROOT"
RUN_ID = "CORRAL_RUN_ID"
NODE = "CORRAL_NODE"

DEFAULT_LEASE_TIMEOUT = 5.0


def worker_environment(
    *,
    experiment: str,
    trial: str,
    role: str,
    index: int,
    name_resolve: dict,
    log_dir: str,
    port_count: int,
    lease_timeout: float,
    cpu: int,
    run_id: str = "",
    fileroot: str | None = None,
    secret_file: str | None = None,
    engines: dict | None = None,
    env_vars: dict[str, str] | None = None,
    offload: bool = False,
    outlive: float = 0.0,
) -> dict[str, str]:
    """The environment a controller gives one worker (read back by ``WorkerSettings``).

    The secret travels as a 0600 file's path (shared filesystem); where workers cannot
    read the controller's files the launcher hands it over itself. ``env_vars`` come last."""
    env = {
        EXPERIMENT: experiment,
        TRIAL: trial,
        ROLE: role,
        INDEX: str(index),
        NAME_RESOLVE: cjson.dumps(name_resolve),
        LOG_DIR: log_dir,
        PORT_COUNT: str(port_count),
        LEASE_TIMEOUT: str(lease_timeout),
        CONTROLLER_PID: str(os.getpid()),
        CONTROLLER_HOST: _socket.gethostname(),
        RUN_ID: run_id,
        "PYTHONUNBUFFERED": "1",
    }
    if outlive:
        env[OUTLIVE] = str(outlive)
    if fileroot is not None:
        env[FILEROOT] = fileroot
    if secret_file is not None:  # else the launcher hands the secret over (never in env)
        env[SECRET_FILE] = secret_file
    if engines:
        env[ENGINES] = cjson.dumps(engines)
    # AReaL's variables: PYTHONPATH, caches, thread counts, torch_memory_saver
    from corral import envvars  # the controller's side only: a worker never needs it

    env.update(envvars.controller_env(cpu, env_vars or {}, offload))
    env.update(env_vars or {})
    return env


def read_secret(env: dict[str, str] | None = None) -> str:
    """The trial secret, from an inherited pipe (``CORRAL_SECRET_FD``: forked workers) or a
    0600 file (``CORRAL_SECRET_FILE``: local and Slurm workers). Never from the
    environment: a secret there is visible in /proc/<pid>/environ and job records."""
    env = os.environ if env is None else env
    if env.get(SECRET):
        raise SystemExit(
            f"corral worker: {SECRET} is set; the trial secret must not travel in the "
            f"environment. Schedulers pass it in a 0600 file ({SECRET_FILE}) or a pipe"
        )
    fd_text = env.get(SECRET_FD)
    if fd_text:
        with os.fdopen(int(fd_text), "r") as fh:
            secret = fh.read().strip()
        env.pop(SECRET_FD, None)
        return secret
    path = env.get(SECRET_FILE)
    if path:
        with open(path) as fh:
            return fh.read().strip()
    raise SystemExit(
        f"corral worker: no trial secret ({SECRET_FILE} or {SECRET_FD} must be set by the "
        "scheduler)"
    )


def advertise_host() -> str:
    """The address other hosts reach this one at."""
    explicit = os.environ.get(ADVERTISE_HOST)
    if explicit:
        return explicit
    name = _socket.gethostname()
    try:
        # an ASCII name as bytes: a str would load the idna codec (with stringprep and
        # unicodedata), a large part of a worker's start
        return _socket.gethostbyname(name.encode() if name.isascii() else name)
    except OSError:
        return "127.0.0.1"


def node_name() -> str:
    """The node this worker runs on, as its launcher names it (LOCAL_RANK counts workers per
    node): ``CORRAL_NODE`` (the Ray backend sets the Ray node id, Slurm's task script the
    node's name), or the hostname. Several Ray or Slurm nodes may share one host (a test
    cluster)."""
    return os.environ.get(NODE) or _socket.gethostname()


class WorkerSettings(
    namedtuple(
        "WorkerSettings",
        (
            "experiment",
            "trial",
            "role",
            "index",
            "name_resolve",
            "log_dir",
            "port_count",
            "lease_timeout",
            "controller_pid",
            "controller_host",
            "die_with_parent",
            "bind_host",
            "backend_id",
            "forked",
            "engines",
            "run_id",
            "outlive",
        ),
        defaults=("", 0.0),
    )
):
    """What a worker is started with, read once from its environment (``from_env``).

    ``experiment``, ``trial``, ``role``: str; ``index``: int; ``name_resolve``: dict (a
    store's description); ``log_dir``: str or None; ``port_count``: int;
    ``lease_timeout``: float; ``controller_pid``: int or None; ``controller_host``: str or
    None; ``die_with_parent``: bool; ``bind_host``: str ("" = the advertised address,
    "0.0.0.0" = every interface); ``backend_id``: str or None; ``forked``: bool;
    ``engines``: dict; ``run_id``: str (default ""); ``outlive``: float (default 0.0).

    A named tuple, neither a dataclass nor ``typing.NamedTuple``: a worker's start imports
    neither ``dataclasses`` (with ``inspect``) nor ``typing``."""

    __slots__ = ()

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> WorkerSettings:
        env = os.environ if env is None else env
        missing = [k for k in (EXPERIMENT, TRIAL, ROLE, NAME_RESOLVE) if not env.get(k)]
        if missing:
            raise SystemExit(
                f"corral worker: {', '.join(missing)} not set; workers are started by a corral "
                "scheduler, not by hand"
            )
        if env.get(INDEX) is not None:
            index = int(env[INDEX])
        else:
            index = int(env.get(INDEX_OFFSET, "0"))
        pid = env.get(CONTROLLER_PID)
        return cls(
            experiment=env[EXPERIMENT],
            trial=env[TRIAL],
            role=env[ROLE],
            index=index,
            name_resolve=cjson.loads(env[NAME_RESOLVE]),
            log_dir=env.get(LOG_DIR) or None,
            port_count=int(env.get(PORT_COUNT, "1")),
            lease_timeout=float(env.get(LEASE_TIMEOUT, DEFAULT_LEASE_TIMEOUT)),
            controller_pid=int(pid) if pid else None,
            controller_host=env.get(CONTROLLER_HOST) or None,
            die_with_parent=env.get(DIE_WITH_PARENT) == "1",
            bind_host=env.get(BIND_HOST, ""),
            backend_id=env.get(BACKEND_ID) or None,
            forked=env.get(FORKED) == "1",
            engines=cjson.loads(env.get(ENGINES) or "{}"),
            run_id=env.get(RUN_ID, ""),
            outlive=float(env.get(OUTLIVE) or 0.0),
        )

    @property
    def worker_id(self) -> str:
        return f"{self.role}/{self.index}"
