"""One background asyncio loop per controller, for fan-outs started from blocking code.

Rendezvous, engine teardown and shutdown requests go to every worker of a role at once.
Running them as coroutines on one loop thread keeps the controller at a fixed number of
threads (not one per worker in flight) and at one connection per worker.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class IOLoop:
    """A daemon thread running an event loop, started on first use."""

    def __init__(self, name: str = "corral-io"):
        self.name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _ensure(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._loop.is_closed():
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name=self.name, daemon=True)
                thread.start()  # RuntimeError at interpreter shutdown: the caller falls back
                self._loop, self._thread = loop, thread
            return self._loop

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for its result (or exception).

        At interpreter shutdown, when no thread can be started, it runs in this thread.
        """
        if self._thread is not None and threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("IOLoop.run called from its own loop thread (would deadlock)")
        try:
            loop = self._ensure()
        except RuntimeError:
            return asyncio.run(coro)
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def close(self) -> None:
        """Stop the loop and its thread (idempotent)."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or loop.is_closed():
            return
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None and thread is not threading.current_thread():
            thread.join(5.0)
        if not loop.is_running():
            loop.close()
