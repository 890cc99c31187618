"""Engines hosted by a worker: created by import path, called on one dedicated thread.

GPU libraries expect calls in order on one thread, so every synchronous method runs on the
single engine thread. Coroutine methods run on the worker's event loop thread.
"""

from __future__ import annotations

import importlib
import inspect
import re
import threading
import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from corral.errors import (
    EngineCallError,
    EngineCreationError,
    EngineImportError,
    WorkerNotFoundError,
)

_IMPORT_PATH = re.compile(
    r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*([:.][A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*)?$"
)


def resolve_import_path(path: str) -> Any:
    """``pkg.mod.Class`` or ``pkg.mod:Class.Inner`` -> the object. Raises EngineImportError."""
    if not isinstance(path, str) or not _IMPORT_PATH.fullmatch(path):
        raise EngineImportError(
            f"engine import path {path!r} is not of the form 'pkg.module.Class'"
        )
    if ":" in path:
        module_name, _, attr_path = path.partition(":")
    else:
        module_name, _, attr_path = path.rpartition(".")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:
        raise EngineImportError(
            f"cannot import module {module_name!r} for engine {path!r}: {type(exc).__name__}: {exc}. "
            "Make sure it is importable on the worker (installed, or on PYTHONPATH)."
        ) from exc
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise EngineImportError(
                f"module {module_name!r} has no attribute {attr_path!r}"
            ) from None
    return obj


class EngineHost:
    def __init__(self) -> None:
        self.engines: dict[str, Any] = {}
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="corral-engine")
        self._loop = None
        self._loop_lock = threading.Lock()

    def _on_engine_thread(self, fn, *args, **kwargs) -> Any:
        return self._thread.submit(fn, *args, **kwargs).result()

    def _await(self, awaitable) -> Any:
        """Run a coroutine on the worker's event loop thread, started on first use."""
        import asyncio

        with self._loop_lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                threading.Thread(
                    target=self._loop.run_forever, name="corral-async", daemon=True
                ).start()
        return asyncio.run_coroutine_threadsafe(_as_coroutine(awaitable), self._loop).result()

    def create(self, name: str, import_path: str, args: list, kwargs: dict) -> None:
        if name in self.engines:
            raise EngineCreationError(f"engine {name!r} already exists on this worker")
        factory = resolve_import_path(import_path)
        try:
            engine = self._on_engine_thread(factory, *args, **kwargs)
            if inspect.isawaitable(engine):
                engine = self._await(engine)
        except Exception as exc:
            raise EngineCreationError(
                f"creating engine {name!r} from {import_path!r} raised {type(exc).__name__}: {exc}\n"
                + traceback.format_exc()
            ) from exc
        self.engines[name] = engine

    def get(self, name: str) -> Any:
        try:
            return self.engines[name]
        except KeyError:
            known = ", ".join(sorted(self.engines)) or "none"
            raise WorkerNotFoundError(
                f"no engine named {name!r} on this worker (engines: {known}); create it first"
            ) from None

    def call(self, name: str, method: str, args: list, kwargs: dict) -> Any:
        engine = self.get(name)
        if not isinstance(method, str) or method.startswith("_"):
            raise EngineCallError(
                f"method name {method!r} is not allowed (private or not a string)"
            )
        fn = getattr(engine, method, None)
        if fn is None or not callable(fn):
            raise EngineCallError(
                f"engine {name!r} ({type(engine).__name__}) has no method {method!r}"
            )
        try:
            if inspect.iscoroutinefunction(fn):
                return self._await(fn(*args, **kwargs))
            result = self._on_engine_thread(fn, *args, **kwargs)
            if inspect.isawaitable(result):
                result = self._await(result)
            return result
        except Exception as exc:
            raise EngineCallError(
                f"{type(engine).__name__}.{method} raised {type(exc).__name__}: {exc}",
                remote_traceback=traceback.format_exc(),
            ) from exc

    def destroy_all(self) -> list[str]:
        """Call ``destroy()`` on each engine that has one, newest first; forget them all."""
        problems = []
        for name in reversed(list(self.engines)):
            engine = self.engines.pop(name)
            destroy = getattr(engine, "destroy", None)
            if callable(destroy):
                try:
                    result = self._on_engine_thread(destroy)
                    if inspect.isawaitable(result):
                        self._await(result)
                except Exception as exc:
                    problems.append(f"{name}: {type(exc).__name__}: {exc}")
        return problems

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)


async def _as_coroutine(awaitable) -> Any:
    return await awaitable
