"""The command-line contract of worker commands (``SchedulingSpec.cmd``, fork ``command``).

AReaL starts its worker modules as ``<cmd> --port P --experiment-name E --trial-name T
--role R --worker-index I --name-resolve-type K --nfs-record-root D --etcd3-addr A
--fileroot F`` (a forked worker also gets ``--host 0.0.0.0`` first). corral passes the same
arguments, so a module written for AReaL parses its command line as before. The worker's
identity still travels in ``CORRAL_*`` environment variables; the arguments are a
courtesy to such modules, and ``--port`` (when not 0) is the port corral's worker serves on.

A module that wants to be reachable through ``call_engine`` ends by calling
``corral.worker.runtime.main()``, which accepts these arguments.
"""

from __future__ import annotations

import json
import os
import socket
import sys

from corral.errors import ConfigError
from corral.worker import env as E

TYPE_CHECKING = False  # typing's, without importing typing (a worker's first fork)
if TYPE_CHECKING:
    import argparse

#: Module paths that mean "the scheduler's own worker" in AReaL configs; corral runs its
#: worker for them (AReaL's RPC server speaks AReaL's protocol, not corral's).
DEFAULT_WORKER_MODULES = ("areal.infra.rpc.rpc_server", "corral.worker")


def contract_args(
    *,
    port: int,
    experiment: str,
    trial: str,
    role: str,
    index: int,
    name_resolve: dict,
    fileroot: str,
    host: str | None = None,
) -> list[str]:
    """The arguments AReaL gives a worker command, in AReaL's order."""
    kind = name_resolve.get("type", "nfs")
    args = ["--host", host] if host else []
    args += [
        "--port", str(port),
        "--experiment-name", experiment,
        "--trial-name", trial,
        "--role", role,
        "--worker-index", str(index),
        "--name-resolve-type", "nfs" if kind == "files" else kind,
        "--nfs-record-root", str(name_resolve.get("root", "")),
        "--etcd3-addr", str(name_resolve.get("address", "")),
        "--fileroot", fileroot,
    ]  # fmt: skip
    return args


def args_from_env(env: dict[str, str], port: int, host: str | None = None) -> list[str]:
    """The contract's arguments for a worker whose corral environment is ``env``."""
    return contract_args(
        port=port,
        experiment=env[E.EXPERIMENT],
        trial=env[E.TRIAL],
        role=env[E.ROLE],
        index=int(env[E.INDEX]) if env.get(E.INDEX) is not None else 0,
        name_resolve=json.loads(env.get(E.NAME_RESOLVE) or "{}"),
        fileroot=env.get(E.FILEROOT, ""),
        host=host,
    )


def free_port() -> int:
    """A port free on this host now (for ``--port`` of a command corral does not own)."""
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports free on this host now (AReaL's ``port_count``)."""
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


def command_argv(
    cmd: str | None, python: str = sys.executable, rewrite_python: bool = True
) -> list[str]:
    """The argv prefix for a spec's ``cmd``: ``python -m corral.worker`` when none is given
    or when it names AReaL's RPC server; with ``rewrite_python`` a leading ``python`` or
    ``python3`` becomes ``python`` (the controller's interpreter, as AReaL does locally)."""
    if not cmd:
        return [python, "-m", "corral.worker"]
    import shlex

    try:
        argv = shlex.split(cmd)
    except ValueError as exc:
        raise ConfigError("SchedulingSpec.cmd", cmd, f"unbalanced quotes ({exc})") from None
    if not argv:
        raise ConfigError("SchedulingSpec.cmd", cmd, "use a non-empty command")
    if "--port" in argv:
        raise ConfigError(
            "SchedulingSpec.cmd",
            cmd,
            "leave out --port: the scheduler picks the port and passes it",
        )
    if len(argv) == 3 and argv[1] == "-m" and argv[2] in DEFAULT_WORKER_MODULES:
        return [python, "-m", "corral.worker"]
    if rewrite_python and os.path.basename(argv[0]) in ("python", "python3"):
        argv[0] = python
    return argv


def module_argv(module: str | None, python: str = sys.executable) -> list[str]:
    """The argv prefix of a forked worker running ``module`` (default: corral's worker)."""
    if not module or module in DEFAULT_WORKER_MODULES:
        return [python, "-m", "corral.worker"]
    return [python, "-m", module]


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the contract's arguments (unknown ones are ignored, none is required)."""
    import argparse  # a module of the user's started with AReaL's arguments only

    parser = argparse.ArgumentParser(prog="corral.worker", add_help=False)
    parser.add_argument("--host", default=None)
    parser.add_argument("--port", type=int, default=0)
    for name in (
        "--experiment-name", "--trial-name", "--role", "--worker-index",
        "--name-resolve-type", "--nfs-record-root", "--etcd3-addr", "--fileroot",
    ):  # fmt: skip
        parser.add_argument(name, default=None)
    known, _ = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    return known
