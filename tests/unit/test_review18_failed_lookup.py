"""review18: a failed lookup inside a running loop (fix17: engine_calls._raising)."""

from __future__ import annotations

import asyncio
import gc
import warnings
from types import SimpleNamespace

import pytest

from corral.controller import engine_calls
from corral.errors import WorkerNotFoundError

#: ``Scheduler.async_call_engine``'s CALL_OPTIONS when none is given
NO_OPTIONS = (None, None, None, None)


def test_a_failed_lookup_is_raised_when_awaited_and_warned_of_when_never_awaited(monkeypatch):
    """docs/areal.md ("Async calls"): a call whose lookup failed is never sent; awaited,
    it raises the lookup's error; never awaited, Python warns that it was never awaited."""

    def unknown(c, worker_id):
        raise WorkerNotFoundError(worker_id, "no such worker")

    monkeypatch.setattr(engine_calls, "worker", unknown)
    c = SimpleNamespace(table=SimpleNamespace(ids={}, unrestartable={}))

    async def main():
        awaited = engine_calls.send_async_call_engine(c, "w/9", "echo", "e", (1,), {}, NO_OPTIONS)
        with pytest.raises(WorkerNotFoundError, match="no such worker"):
            await awaited
        dropped = engine_calls.send_async_call_engine(c, "w/8", "echo", "e", (1,), {}, NO_OPTIONS)
        del dropped
        gc.collect()

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", RuntimeWarning)
        asyncio.run(main())
    assert any("was never awaited" in str(w.message) for w in seen), [str(w.message) for w in seen]
