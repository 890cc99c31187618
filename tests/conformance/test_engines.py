"""Engines: creation by import path, calls, async calls, errors carried back."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import numpy as np
import pytest

from corral import EngineCallError, EngineCreationError, EngineImportError, Job, SchedulingSpec

ECHO = "corral.testing.engines.EchoEngine"


@dataclass
class Sample:
    prompt: str
    tokens: np.ndarray
    reward: float


@pytest.fixture
def worker(sched):
    (wid,) = sched.create_workers(Job(role="eng", replicas=1, tasks=[SchedulingSpec(cpu=1)]))
    return wid


def test_call_round_trips_nested_data_and_arrays(sched, worker):
    asyncio.run(sched.create_engine(worker, ECHO, "e"))
    value = {
        "a": [1, 2.5, None, True],
        "t": (1, "x"),
        3: b"raw",
        "arr": np.arange(12, dtype=np.int64).reshape(3, 4),
        "f16": np.ones(5, np.float16),
        "sample": Sample("hi", np.arange(3), 0.5),
    }
    out = sched.call_engine(worker, "echo", "e", value)
    assert out["a"] == [1, 2.5, None, True] and out["t"] == (1, "x") and out[3] == b"raw"
    assert out["arr"].dtype == np.int64 and np.array_equal(out["arr"], value["arr"])
    assert out["f16"].dtype == np.float16
    assert isinstance(out["sample"], Sample) and out["sample"].prompt == "hi"


def test_default_engine_name_is_the_worker_id(sched, worker):
    assert asyncio.run(sched.create_engine(worker, ECHO)) is None  # AReaL returns None too
    assert sched.call_engine(worker, "add", None, 2, b=3) == 5
    assert sched.call_engine(worker, "add", worker, 2, b=3) == 5


def test_several_engines_per_worker(sched, worker):
    asyncio.run(sched.create_engine(worker, ECHO, "one", tag="1"))
    asyncio.run(sched.create_engine(worker, ECHO, "two", tag="2"))
    sched.call_engine(worker, "echo", "one", 1)
    assert sched.call_engine(worker, "count", "one") == 1
    assert sched.call_engine(worker, "count", "two") == 0


def test_sync_methods_run_on_one_engine_thread_and_coroutines_are_awaited(sched, worker):
    """Eight calls in flight at once (each holds the engine thread for a moment): every
    one ran on the same engine thread, one after another."""
    asyncio.run(sched.create_engine(worker, ECHO, "e"))

    async def concurrently():
        return await asyncio.gather(
            *(sched.async_call_engine(worker, "slow_thread_name", "e", 0.05) for _ in range(8))
        )

    names = set(asyncio.run(concurrently()))
    names |= {sched.call_engine(worker, "thread_name", "e") for _ in range(3)}
    assert len(names) == 1 and names.pop().startswith("corral-engine")
    assert sched.call_engine(worker, "overlap", "e") == 1
    assert sched.call_engine(worker, "async_echo", "e", "x", delay=0.01) == "x"


def test_fifty_concurrent_async_calls_each_get_their_own_result(sched, worker):
    asyncio.run(sched.create_engine(worker, ECHO, "e"))

    async def many():
        return await asyncio.gather(
            *(sched.async_call_engine(worker, "echo", "e", i) for i in range(50))
        )

    assert asyncio.run(many()) == list(range(50))


def test_engine_import_error(sched, worker):
    with pytest.raises(EngineImportError, match="no_such_module_xyz"):
        asyncio.run(sched.create_engine(worker, "no_such_module_xyz.Engine", "bad"))


def test_engine_creation_error(sched, worker):
    with pytest.raises(EngineCreationError, match="engine init failed on purpose"):
        asyncio.run(sched.create_engine(worker, "corral.testing.engines.FailingInitEngine", "bad"))


def test_engine_call_error_carries_remote_traceback(sched, worker):
    asyncio.run(sched.create_engine(worker, ECHO, "e"))
    with pytest.raises(EngineCallError) as info:
        sched.call_engine(worker, "fail", "e", "kaputt")
    assert "kaputt" in str(info.value)
    assert (
        "ValueError" in info.value.remote_traceback and "engines.py" in info.value.remote_traceback
    )
    assert sched.call_engine(worker, "echo", "e", 7) == 7


def test_private_methods_cannot_be_called(sched, worker):
    asyncio.run(sched.create_engine(worker, ECHO, "e"))
    with pytest.raises(EngineCallError, match="not allowed"):
        sched.call_engine(worker, "__init__", "e")


def test_set_worker_env(sched, worker):
    asyncio.run(sched.create_engine(worker, ECHO, "e"))
    asyncio.run(sched.set_worker_env(worker, {"CORRAL_TEST_FLAG": "42"}))
    assert sched.call_engine(worker, "getenv", "e", "CORRAL_TEST_FLAG") == "42"


def test_large_payload_round_trip(sched, worker):
    asyncio.run(sched.create_engine(worker, ECHO, "e"))
    data = np.random.default_rng(0).standard_normal(4 * 1024 * 1024).astype(np.float32)
    out = sched.call_engine(worker, "echo", "e", data)
    assert out.dtype == np.float32 and np.array_equal(out, data)


def test_an_unknown_engine_name_is_both_worker_not_found_and_engine_call_error(sched, worker):
    """AReaL's worker answers 404 and its controller raises EngineCallError; corral's
    lookup error is WorkerNotFoundError: the error is both (issue 24, defect 4)."""
    from corral import WorkerNotFoundError

    asyncio.run(sched.create_engine(worker, ECHO, "e"))
    with pytest.raises(EngineCallError, match="no engine named 'ghost'") as info:
        sched.call_engine(worker, "echo", "ghost", 1)
    assert isinstance(info.value, WorkerNotFoundError)
    with pytest.raises(WorkerNotFoundError):
        asyncio.run(sched.async_call_engine(worker, "echo", "ghost", 1))
