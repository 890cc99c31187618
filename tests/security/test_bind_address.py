"""Attack 4: workers advertised at 127.0.0.1 listened on 0.0.0.0. Now a worker binds the
address it advertises; every interface only when asked (CORRAL_BIND_HOST=0.0.0.0)."""

from __future__ import annotations

import psutil

from corral import Job, SchedulingSpec


def _listening(pid: int, port: int) -> set[str]:
    return {
        c.laddr.ip
        for c in psutil.Process(pid).net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == port
    }


def test_worker_listens_only_on_its_advertised_address(sched) -> None:
    sched.create_workers(Job(role="bound", replicas=1))
    worker = sched.get_workers("bound")[0]
    assert _listening(worker.pid, worker.port) == {worker.ip}
    assert worker.ip != "0.0.0.0"


def test_listening_on_every_interface_is_an_explicit_option(sched) -> None:
    spec = SchedulingSpec(cpu=1, env_vars={"CORRAL_BIND_HOST": "0.0.0.0"})
    sched.create_workers(Job(role="open", replicas=1, tasks=[spec]))
    worker = sched.get_workers("open")[0]
    assert _listening(worker.pid, worker.port) == {"0.0.0.0"}
    assert sched.health(worker.id)["status"] == "ok"
