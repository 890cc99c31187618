"""``except`` clauses naming AReaL's exception classes catch what corral raises.

With AReaL's ``areal.infra.scheduler.exceptions`` loaded (the ``areal`` fixture imports
it, as AReaL's controllers do), each error corral raises in a real situation is caught by
an ``except`` naming AReaL's class of the same name, and is still corral's class with
corral's message. Without AReaL loaded nothing changes: tests/integration/test_areal_not_imported.py.
"""

from __future__ import annotations

import asyncio
import pickle

import pytest

import corral
from corral import Job, SchedulingSpec

ECHO = "corral.testing.engines.EchoEngine"


def _caught_as(areal_class: type, corral_class: type, action):
    """Run ``action`` the way AReaL-era code does, ``except <AReaL's class>``."""
    try:
        action()
    except areal_class as exc:  # the clause under test
        assert isinstance(exc, corral_class), type(exc).__mro__
        assert type(exc).__module__ == "corral.errors"  # corral's class and message
        return exc
    pytest.fail(f"nothing raised; expected {areal_class.__name__}")


def test_areal_except_clauses_catch_what_corral_raises(areal, sched):
    A = areal["areal.infra.scheduler.exceptions"]
    sched.create_workers(Job(role="base", replicas=1))
    (wid,) = sched.create_workers(Job(role="e", replicas=1))
    run = asyncio.run

    _caught_as(
        A.WorkerCreationError,
        corral.WorkerCreationError,
        lambda: sched.create_workers(Job(role="base", replicas=1)),
    )
    _caught_as(
        A.GPUAllocationError,
        corral.GPUAllocationError,
        lambda: sched.create_workers(Job(role="g", replicas=1, tasks=[SchedulingSpec(gpu=99)])),
    )
    _caught_as(
        A.WorkerNotFoundError,
        corral.WorkerNotFoundError,
        lambda: sched.call_engine("ghost/0", "noop", "e"),
    )
    imported = _caught_as(
        A.EngineImportError,
        corral.EngineImportError,
        lambda: run(sched.create_engine(wid, "nonexistent.module.Engine", "x")),
    )
    assert isinstance(imported, A.EngineCreationError)  # corral's is one, as AReaL's callers catch
    _caught_as(
        A.EngineCreationError,
        corral.EngineCreationError,
        lambda: run(sched.create_engine(wid, "corral.testing.engines.FailingInitEngine", "y")),
    )
    run(sched.create_engine(wid, ECHO, "e"))
    call = _caught_as(
        A.EngineCallError,
        corral.EngineCallError,
        lambda: sched.call_engine(wid, "fail", "e", "boom"),
    )
    assert (call.worker_id, call.method) == (wid, "fail") and "boom" in str(call)
    again = pickle.loads(pickle.dumps(call))  # a twin travels as corral's class
    assert isinstance(again, A.EngineCallError) and str(again) == str(call)

    timeout = _caught_as(
        A.WorkerTimeoutError,
        corral.WorkerTimeoutError,
        lambda: sched.call_engine(wid, "sleep", "e", 5, http_timeout=1.0),
    )
    assert timeout.timeout == 1.0 and isinstance(timeout, TimeoutError)
    failed = _caught_as(
        A.SchedulerError,  # AReaL's base class catches every scheduler error
        corral.WorkerFailedError,
        lambda: sched.call_engine(wid, "exit_now", "e", 7),
    )
    assert isinstance(failed, A.WorkerFailedError) and failed.worker_id == wid
