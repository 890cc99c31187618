"""Foreign servers (corral.foreign): worker commands written to AReaL's contract that serve
their own HTTP API and never register with corral (AReaL's proxy rollout server is one).
They are ready when they answer GET /health on the port they were given, and get a
Worker with ip and ports, death detection, log capture, cleanup with their role and a
clear refusal of engine calls (issue 24, defect 2)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import urllib.request

import pytest

from corral import (
    EngineCallError,
    EngineCreationError,
    Job,
    SchedulingSpec,
    WorkerCreationError,
    WorkerFailedError,
    WorkerTimeoutError,
    name_resolve_keys,
)
from corral.logs import replica_log_path
from tests.conformance.harness import pid_alive

SERVER = "corral.testing.foreign_server"


def get_json(worker, path: str) -> dict:
    url = f"http://{worker.ip}:{worker.worker_ports[0]}{path}"
    with urllib.request.urlopen(url, timeout=10) as reply:
        return json.loads(reply.read())


def wait_until(predicate, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        time.sleep(0.1)


def logged(sched, worker) -> str:
    try:
        with open(replica_log_path(sched.log_dir, worker.role, worker.index)) as fh:
            return fh.read()
    except FileNotFoundError:
        return ""


def assert_refuses_engines(sched, worker) -> None:
    with pytest.raises(EngineCreationError, match="foreign server"):
        asyncio.run(sched.create_engine(worker.id, "corral.testing.engines.EchoEngine"))
    with pytest.raises(EngineCallError, match="foreign server"):
        sched.call_engine(worker.id, "echo", None, 1)
    with pytest.raises(EngineCallError, match="foreign server"):
        asyncio.run(sched.async_call_engine(worker.id, "echo", None, 1))


def test_fork_workers_runs_a_foreign_server_to_areals_contract(sched):
    sched.create_workers(Job(role="gen", replicas=2))
    assert sched.fork_workers("proxy", "gen", command=SERVER) == ["proxy/0", "proxy/1"]
    parents, proxies = sched.get_workers("gen"), sched.get_workers("proxy")
    for parent, proxy in zip(parents, proxies, strict=True):
        assert proxy.foreign and proxy.forked and not parent.foreign
        assert proxy.ip == parent.ip and proxy.pid and proxy.pid != parent.pid
        args = get_json(proxy, "/args")  # what the module parsed from its command line
        assert args["port"] == int(proxy.worker_ports[0]) and args["host"] == "0.0.0.0"
        assert (args["role"], args["worker_index"]) == ("proxy", proxy.index)
        assert (args["experiment_name"], args["trial_name"]) == (
            sched.experiment_name,
            sched.trial_name,
        )
        wait_until(lambda p=proxy: "serving on" in logged(sched, p), "its output in its log")
    assert_refuses_engines(sched, proxies[0])
    asyncio.run(sched.create_engine("gen/0", "corral.testing.engines.EchoEngine"))
    assert sched.call_engine("gen/0", "echo", None, "hi") == "hi"  # its parent is corral's

    # death detection: its host worker records the death with its exit code
    health = name_resolve_keys.worker_health_key(
        sched.experiment_name, sched.trial_name, "proxy", 1
    )
    os.kill(proxies[1].pid, signal.SIGKILL)
    wait_until(lambda: sched.name_resolve.get(health) is not None, "its death recorded")
    record = json.loads(sched.name_resolve.get(health))
    assert record["state"] == "dead" and record["exit_code"] == -signal.SIGKILL

    sched.delete_workers("proxy")  # cleanup with its role; the parents stay
    wait_until(lambda: not pid_alive(proxies[0].pid), "the server stopped with its role")
    assert all(pid_alive(p.pid) for p in parents)


def test_a_spec_cmd_foreign_server_is_ready_by_its_health_endpoint(sched):
    if sched.backend != "local":
        pytest.skip(
            f"{sched.backend}: SchedulingSpec.cmd is refused on Ray (workers are actors) and "
            "Slurm passes --port 0 (the node is unknown when the script is written)"
        )
    spec = SchedulingSpec(cmd=f"python -m {SERVER}", port_count=3)
    assert sched.create_workers(Job(role="srv", replicas=2, tasks=[spec])) == ["srv/0", "srv/1"]
    servers = sched.get_workers("srv")
    for server in servers:
        assert server.foreign and not server.forked and server.pid
        assert len(set(server.worker_ports)) == 3
        assert get_json(server, "/args")["port"] == int(server.worker_ports[0])
        wait_until(lambda s=server: "serving on" in logged(sched, s), "its output in its log")
    assert_refuses_engines(sched, servers[0])

    os.kill(servers[0].pid, signal.SIGKILL)  # death detection: the launcher's poll
    wait_until(lambda: sched.worker_status()["srv/0"].startswith("dead"), "its death noticed")
    with pytest.raises(WorkerFailedError):
        sched.get_workers("srv")
    sched.delete_workers("srv")
    wait_until(lambda: not pid_alive(servers[1].pid), "the server stopped with its role")


def processes_of(trial: str, role: str) -> list[int]:
    """Pids of this machine's processes started with ``--trial-name trial --role role``
    (AReaL's arguments), whatever their parent."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                argv = fh.read().split(b"\0")
        except OSError:
            continue
        pairs = set(zip(argv, argv[1:], strict=False))
        if (b"--trial-name", trial.encode()) in pairs and (b"--role", role.encode()) in pairs:
            found.append(int(entry))
    return found


def test_a_failed_fork_retires_every_process_it_started(backend):
    """One forked process never gets ready (as under load): fork_workers fails, and the
    processes it did start are stopped with it, not left running (issue 24, defect 7)."""
    sched = backend.scheduler(startup_timeout=8)
    try:
        stall = SchedulingSpec(env_vars={"FOREIGN_SERVER_STALL_INDEX": "1"})
        sched.create_workers(Job(role="gen", replicas=3, tasks=[stall]))
        with pytest.raises((WorkerCreationError, WorkerTimeoutError)):
            sched.fork_workers("proxy", "gen", command=SERVER)
        assert "proxy" not in sched.roles
        trial = sched.trial_name
        wait_until(lambda: not processes_of(trial, "proxy"), "no proxy process left", 15.0)
        # the role can be forked again: nothing of the failed attempt is in the way
        gen = sched.get_workers("gen")
        assert all(pid_alive(w.pid) for w in gen)
    finally:
        sched.close()
    assert processes_of(trial, "proxy") == []
    assert backend.leftovers(sched.experiment_name, trial) == []
