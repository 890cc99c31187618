"""A real worker process, from its start until it has registered, imports nothing that
must stay lazy: third-party packages, corral's parts that serve no call, and the
standard library's heavier modules.

It is checked in a fresh process only: an in-process check (emptying ``sys.modules``
and importing again) races with the threads of live fixtures in the same pytest process
and can leave half-imported C extensions behind.

The worker runs under ``python -X importtime`` with stderr on its stdout pipe, so every
module it imports is listed, in order, before the line it prints once its name-resolve
records are written (``serving at``); what it imports after that line (on first use) is
not the start's.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import signal
import subprocess
import sys

from tests.support.standalone_worker import standalone_worker_env

#: loaded on first use only, never by a worker's start
MUST_STAY_LAZY = (
    "torch", "ray", "numpy", "yaml", "rich", "cryptography", "psutil",
    # the data plane, the live view, the controller's config and scheduler, the backends
    "corral.data.store", "corral.data.fetch", "corral.data.relay", "corral.data.routes",
    "corral.data.plane", "corral.observe", "corral.config", "corral.spec",
    "corral.backends", "corral.controller.scheduler", "corral.launcher", "corral.envvars",
    "corral.worker.fork", "corral.worker.args", "corral.procs", "corral.logs",
    "corral.worker.fork_template", "corral.worker.template_process",  # the first fork's
    "corral.worker.seeding", "corral.worker.dp_layout",  # one request each, if any
)  # fmt: skip

#: standard-library modules a worker's start does without (each costs a share of a bare
#: ``python -c pass``): loaded on first use by the code that needs them
STDLIB_LAZY = (
    "dataclasses", "inspect", "typing", "logging", "argparse", "subprocess", "asyncio",
    "concurrent.futures", "tempfile", "shutil", "ctypes", "traceback", "encodings.idna",
    "ipaddress",  # rpc.peer_uid packs addresses with socket.inet_pton (issue 29)
    "queue", "heapq",  # worker.engines takes SimpleQueue from _queue (issue 29)
    # JSON through corral.cjson (json's C codec: json.decoder compiles patterns with re,
    # re loads enum); sockets and signal handlers through _socket and _signal (socket.py
    # and signal.py turn their constants into enums); OpenSSL's functions straight from
    # _hashlib (hashlib's table of algorithms with _blake2, hmac's warnings): issue 29
    "json", "re", "enum", "socket", "signal", "hashlib", "hmac", "_blake2", "array",
    "selectors", "math",  # the gate polls with select.poll; wire has no math at start
)  # fmt: skip


@contextlib.contextmanager
def _listed_worker(tmp_path, engines: dict | None = None):
    """A worker under ``-X importtime``, until it registered: yields the modules its start
    imported, its address and its output pipe (the imports of later requests follow)."""
    env = standalone_worker_env(
        tmp_path, "imports", lease_timeout=30.0, engines=engines, parent_pid=os.getpid()
    )
    proc = subprocess.Popen(
        [sys.executable, "-X", "importtime", "-m", "corral.worker"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    imported, seen = [], []
    try:
        for raw in proc.stdout:
            line = raw.decode(errors="replace")
            seen.append(line)
            if "serving at" in line:
                address = line.split("serving at ", 1)[1].split()[0]
                yield imported, address, proc.stdout
                return
            imported.extend(_module_of(line))
        raise AssertionError("the worker ended before it registered:\n" + "".join(seen[-40:]))
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()


def _module_of(line: str) -> list[str]:
    """The module an ``-X importtime`` line names (none for other lines)."""
    if line.startswith("import time:") and "|" in line and "self [us]" not in line:
        return [line.rsplit("|", 1)[1].strip()]
    return []


def _started_worker_imports(tmp_path, engines: dict | None = None) -> list[str]:
    with _listed_worker(tmp_path, engines) as (imported, _address, _out):
        return list(imported)


def _lazy_ones(imported: list[str]) -> list[str]:
    lazy = MUST_STAY_LAZY + STDLIB_LAZY
    return [m for m in imported if any(m == x or m.startswith(x + ".") for x in lazy)]


def test_a_started_worker_imported_nothing_that_must_stay_lazy(tmp_path):
    imported = _started_worker_imports(tmp_path)
    assert "corral.worker.runtime" in imported  # the listing is the worker's own
    found = _lazy_ones(imported)
    assert found == [], f"a worker's start imported {found}; load them on first use"


def test_the_check_sees_the_data_plane_a_worker_with_engines_loads_at_start(tmp_path):
    """The check itself: a worker given engines in its environment makes them before it
    registers, and with them the data plane (engine code may keep values)."""
    imported = _started_worker_imports(tmp_path, {"e": "corral.testing.engines.EchoEngine"})
    assert "corral.data.store" in _lazy_ones(imported)


def test_a_workers_first_pipelined_requests_make_no_thread_pool(tmp_path):
    """``/set_env`` (the torch.distributed variables) and ``/configure`` (the experiment
    config): the first requests of every worker that create_workers or fork_workers
    starts, on a pipelined connection; they are answered on the connection's thread,
    without importing ``concurrent.futures`` (and ``logging``) for the pool that
    pipelined requests otherwise run on."""
    from corral.rpc.async_client import AsyncRPCClient

    async def set_env(address: str) -> None:
        client = AsyncRPCClient("s" * 64)
        try:
            await client.request(address, "/set_env", {"env": {"RANK": "0"}})
            config = {"config": {"seed": 1}, "role": "w", "rank": 0}
            await client.request(address, "/configure", config)
        finally:
            await client.aclose()

    with _listed_worker(tmp_path) as (_imported, address, out):
        asyncio.run(set_env(address))
        later = _later_imports(out)
    pool = [m for m in later if m.startswith(("concurrent", "logging"))]
    assert pool == [], f"the first pipelined /set_env and /configure imported {pool}"


def test_configure_seeds_without_importing_the_configs_module(tmp_path):
    """``/configure`` as create_workers sends it, an experiment config (here as the wire
    carries a ``corral.config.BaseExperimentConfig`` with a ``seed``): the worker seeds
    from it without importing ``corral.config`` (dataclasses, inspect, typing: ~30 ms of
    CPU in every new worker at once) to rebuild a config nothing in the worker reads."""
    from corral.rpc.client import RPCClient
    from corral.rpc.wire import DataclassRecord

    config = DataclassRecord(
        "corral.config:BaseExperimentConfig", {"experiment_name": "imports", "seed": 7}
    )
    with _listed_worker(tmp_path) as (imported, address, out):
        client = RPCClient("s" * 64)
        client.request(address, "/configure", {"config": config, "role": "w", "rank": 1})
        later = _later_imports(out)
    rebuilding = ("corral.config", "dataclasses", "typing", "inspect")
    found = [m for m in later if any(m == x or m.startswith(x + ".") for x in rebuilding)]
    assert found == [], f"/configure imported {found} to rebuild the experiment config"
    assert "random" not in imported and "random" in later  # seeded: random.seed(7 + 1)


#: what a worker's first fork of corral's own worker does without (it used to load ~80 ms
#: of CPU of them in the forking worker: the foreign-server probe's http.client with email
#: and ssl, the controller's spec with typing, argparse, dataclasses for paths.TrialPaths)
FIRST_FORK_LAZY = (
    "http", "email", "ssl", "argparse", "typing", "dataclasses", "inspect",
    "corral.spec", "corral.foreign",
)  # fmt: skip


def _later_imports(out) -> list[str]:
    """The modules listed on ``out`` by now: the worker wrote a request's imports before
    its reply, so they are in the pipe."""
    later: list[str] = []
    poller = select.poll()  # not select.select: pytest may hold descriptors above 1023
    poller.register(out.fileno(), select.POLLIN)
    while poller.poll(500):
        chunk = os.read(out.fileno(), 65536)
        if not chunk:
            break
        for line in chunk.decode(errors="replace").splitlines():
            later.extend(_module_of(line))
    return later


def test_a_workers_first_fork_loads_only_what_forking_needs(tmp_path):
    from corral.rpc.client import RPCClient

    with _listed_worker(tmp_path) as (_imported, address, out):
        client = RPCClient("s" * 64)
        reply = client.request(
            address,
            "/fork",
            {"role": "child", "index": 0, "module": None, "env": {}, "timeout": 60},
            timeout=90,
        )
        later = _later_imports(out)
        client.request(address, "/kill_forked_worker", {"worker_id": "child/0"}, timeout=30)
    assert reply["address"] and "corral.worker.fork" in later  # the child registered
    found = [m for m in later if any(m == x or m.startswith(x + ".") for x in FIRST_FORK_LAZY)]
    assert found == [], f"a worker's first fork imported {found}"
