"""Foreign servers: worker commands that serve their own HTTP API instead of corral's.

AReaL's OpenAI-compatible proxy rollout server and its RPC server are modules of this
kind: started with AReaL's arguments (``--port P ...``, see ``corral.worker.args``) by
``SchedulingSpec(cmd="python -m <module>")`` or ``fork_workers(..., command="<module>")``,
they never register with corral. As in AReaL, such a process is ready when it answers
``GET /health`` with 200 on the port it was given. corral's own worker answers an
unauthenticated request with 401, so a plain 200 tells a foreign server from a corral
worker that has not registered yet; whichever comes first decides which kind a replica is.

A foreign server is a :class:`~corral.spec.Worker` with ``foreign=True``, its ip and its
ports; its launcher (or the worker that forked it) watches it for death and captures its
log, and it is stopped with its role. corral sends it nothing: engines, calls,
environment and configuration are refused (:func:`refusal`), the rendezvous and
``/configure`` of a new role skip it.
"""

from __future__ import annotations

import http.client
from dataclasses import dataclass

from corral.errors import EngineCallError, EngineCreationError, SchedulerError
from corral.spec import Worker

#: Seconds between two readiness probes of one replica.
PROBE_INTERVAL = 0.25
#: Seconds one probe may take (connect and answer).
PROBE_TIMEOUT = 1.0


@dataclass(frozen=True)
class ServedAt:
    """Where a worker command was told to serve: ``ports[0]`` went as ``--port``."""

    ip: str
    ports: list[int]
    host: str = ""
    pid: int | None = None


def answers_health(ip: str, port: int, timeout: float = PROBE_TIMEOUT) -> bool:
    """True when ``GET /health`` on ``ip:port`` answers 200 without authentication."""
    conn = http.client.HTTPConnection(ip, port, timeout=timeout)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def foreign_worker(
    role: str, index: int, at: ServedAt, *, forked: bool = False, backend_id: str | None = None
) -> Worker:
    """The ``Worker`` of a foreign server that answered its health check at ``at``."""
    return Worker(
        id=f"{role}/{index}",
        ip=at.ip,
        worker_ports=[str(p) for p in at.ports],
        role=role,
        index=index,
        host=at.host,
        pid=at.pid,
        forked=forked,
        backend_id=backend_id,
        foreign=True,
    )


def refusal(worker: Worker, what: str) -> SchedulerError:
    """The error for ``what`` (a Scheduler method) asked of a foreign server."""
    why = (
        f"{worker.id} is a foreign server (its own HTTP API at {worker.address}, ready by "
        f"GET /health): corral cannot {what} on it. Talk to it over its own API, or make its "
        "module end by running corral.worker.runtime.main() to host corral engines"
    )
    if what == "create_engine":
        return EngineCreationError(worker.id, why)
    if what in ("call_engine", "async_call_engine"):
        return EngineCallError(worker.id, what, why)
    return SchedulerError(why)
