"""Engines hosted by a worker: created by import path, called on one dedicated thread.

GPU libraries expect calls in order on one thread, so every synchronous method runs on the
single engine thread. Coroutine methods run on the worker's event loop thread.

The thread itself, and how it also waits on a connection lent to it: ``worker/engine_thread.py``.
"""

from __future__ import annotations

import _thread
import os
import sys
import threading

from corral.errors import (
    EngineCallError,
    EngineCreationError,
    EngineImportError,
    EngineNotFoundError,
)
from corral.worker import broadcast as _bcast
from corral.worker.engine_thread import EngineThread
from corral.worker.env import ENGINE_ALLOW

__all__ = ["EngineHost", "EngineThread"]

TYPE_CHECKING = False  # typing's, without importing typing (a worker's start)
if TYPE_CHECKING:
    from typing import Any

# a pattern, compiled (and cached by ``re``) by the first engine, not by a worker's start
_IMPORT_PATH = r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*([:.][A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*)?$"


def resolve_import_path(path: str) -> Any:
    """``pkg.mod.Class`` or ``pkg.mod:Class.Inner`` -> the object. Raises EngineImportError."""
    import importlib  # with warnings
    import re  # the first engine's: not a worker's start

    if not isinstance(path, str) or not re.fullmatch(_IMPORT_PATH, path):
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


# corral's own modules that may define engines; the rest of corral is machinery.
_CORRAL_ENGINE_MODULES = ("corral.testing", "corral.demo")
_COROUTINE_FUNCTIONS: dict[Any, bool] = {}
#: ``EngineHost.call_here`` of a coroutine method: it did not run
NOT_HERE = object()


# ``inspect`` (with ast, dis and tokenize) is imported by the first engine, not by a
# worker's start: the functions below import it where they need it.
_PLAIN = frozenset({type(None), bool, int, float, str, bytes, list, tuple, dict})


def _awaitable(value: Any) -> bool:
    """``inspect.isawaitable(value)``, answered at once for the plain values most calls
    return."""
    if type(value) in _PLAIN:
        return False
    import inspect

    return inspect.isawaitable(value)


def _traceback() -> str:
    import traceback

    return traceback.format_exc()


def is_coroutine_method(fn: Any) -> bool:
    """``inspect.iscoroutinefunction(fn)``, remembered per function (a bound method's
    ``__func__``): asking ``inspect`` costs more than a small engine call itself."""
    key = getattr(fn, "__func__", None)
    known = None if key is None else _COROUTINE_FUNCTIONS.get(key)
    if known is None:
        import inspect

        known = inspect.iscoroutinefunction(fn)
        if key is not None:
            if len(_COROUTINE_FUNCTIONS) >= 4096:  # functions made on the fly: stay bounded
                _COROUTINE_FUNCTIONS.clear()
            _COROUTINE_FUNCTIONS[key] = known
    return known


def _top(module: str) -> str:
    return module.partition(".")[0]


def is_stdlib_module(module: str) -> bool:
    return _top(module) in sys.stdlib_module_names or module == "builtins"


def check_engine_factory(path: str, factory: Any) -> None:
    """The engine creation policy (docs/security.md). A factory must be

    * a class, or a function written in Python (not a builtin such as ``os.system``);
    * defined in a module outside Python's standard library and builtins (so
      ``subprocess.Popen``, ``subprocess.run``, ``os.system``, ``builtins.eval``,
      ``pty.spawn`` are refused, also when re-exported under another name);
    * not part of corral's machinery (``corral.procs.spawn`` ...), except
      ``corral.testing`` and ``corral.demo``;

    unless its exact import path is listed in ``CORRAL_ENGINE_ALLOW`` (comma-separated).
    This stops mistakes and the obvious command-runners; it is not a sandbox: whoever
    holds the trial secret may run any engine class importable on the worker.
    """
    allowed = {p.strip() for p in os.environ.get(ENGINE_ALLOW, "").split(",") if p.strip()}
    if path in allowed:
        return
    fix = (
        f"name a class or function of your own package, or list {path!r} in {ENGINE_ALLOW} "
        "on the worker if you really mean it"
    )
    import inspect

    if not (inspect.isclass(factory) or inspect.isfunction(factory)):
        raise EngineImportError(
            f"engine import path {path!r} names a {type(factory).__name__}, not a class or a "
            f"Python function; {fix}"
        )
    module = getattr(factory, "__module__", None) or ""
    if is_stdlib_module(module):
        raise EngineImportError(
            f"engine import path {path!r} resolves to {module}.{factory.__qualname__}, part of "
            f"Python's standard library, which the engine policy refuses; {fix}"
        )
    if _top(module) == "corral" and not module.startswith(_CORRAL_ENGINE_MODULES):
        raise EngineImportError(
            f"engine import path {path!r} resolves to corral's own {module}, not an engine; {fix}"
        )


class EngineHost:
    def __init__(self) -> None:
        self.engines: dict[str, Any] = {}
        self._thread = EngineThread()
        # on the engine thread's every lent call: its own methods, without a layer here
        self.park = self._thread.park
        self.idle = self._thread.idle
        self._loop = None
        self._loop_lock = threading.Lock()

    def _on_engine_thread(self, fn, *args, **kwargs) -> Any:
        return self._thread.run(fn, *args, **kwargs)

    def on_engine_thread(self) -> bool:
        """Is the caller the engine thread (serving a lent connection)?"""
        return _thread.get_ident() == self._thread.ident

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
        check_engine_factory(import_path, factory)
        try:
            engine = self._on_engine_thread(factory, *args, **kwargs)
            if _awaitable(engine):
                engine = self._await(engine)
        except Exception as exc:
            raise EngineCreationError(
                f"creating engine {name!r} from {import_path!r} raised {type(exc).__name__}: {exc}\n"
                + _traceback()
            ) from exc
        self.engines[name] = engine

    def get(self, name: str) -> Any:
        try:
            return self.engines[name]
        except KeyError:
            known = ", ".join(sorted(self.engines)) or "none"
            raise EngineNotFoundError(
                f"no engine named {name!r} on this worker (engines: {known}); create it first"
            ) from None

    def _method(self, name: str, method: str) -> tuple[Any, Any]:
        engine = self.engines.get(name)
        if engine is None:
            engine = self.get(name)  # raises EngineNotFoundError, unless it is None itself
        if not isinstance(method, str) or method.startswith("_"):
            raise EngineCallError(
                f"method name {method!r} is not allowed (private or not a string)"
            )
        fn = getattr(engine, method, None)
        if fn is None or not callable(fn):
            raise EngineCallError(
                f"engine {name!r} ({type(engine).__name__}) has no method {method!r}"
            )
        return engine, fn

    def prepare(
        self, name: str, method: str, args: list, kwargs: dict, broadcast: bool | None = None
    ):
        """For a synchronous method: a callable that runs it where it is called (meant for
        the engine thread, through ``submit``), with ``call``'s error wrapping. None for a
        coroutine method (``call`` runs those on the event loop). Raises what ``call``
        raises for an unknown engine or method. ``broadcast``: see :meth:`call`."""
        engine, fn = self._method(name, method)
        if is_coroutine_method(fn):
            return None
        return lambda: self._run_sync(engine, name, method, fn, broadcast, args, kwargs)

    def call_here(
        self, name: str, method: str, args: list, kwargs: dict, broadcast: bool | None = None
    ) -> Any:
        """``prepare``'s callable run at once, where this is called (the engine thread, with
        nothing queued): its result. ``NOT_HERE`` for a coroutine method (nothing ran)."""
        engine, fn = self._method(name, method)
        known = _COROUTINE_FUNCTIONS.get(getattr(fn, "__func__", None))  # is_coroutine_method's
        if known or (known is None and is_coroutine_method(fn)):
            return NOT_HERE
        return self._run_sync(engine, name, method, fn, broadcast, args, kwargs)

    def _arguments(self, engine, name, method, broadcast, args, kwargs) -> tuple[list, dict]:
        """The call's arguments, or its data-parallel head's (corral.worker.broadcast).
        Runs on the engine thread: every rank of the group joins the same collective."""
        if not _bcast.wanted(engine, broadcast):
            return args, kwargs
        return _bcast.share(engine, name, method, args, kwargs)

    def _run_sync(self, engine, name, method, fn, broadcast, args, kwargs) -> Any:
        if broadcast is not False and _bcast.wanted(engine, broadcast):  # ``_arguments``
            args, kwargs = _bcast.share(engine, name, method, args, kwargs)
        try:
            result = fn(*args, **kwargs)
            if type(result) not in _PLAIN and _awaitable(result):
                result = self._await(result)
            return result
        except Exception as exc:
            raise EngineCallError(
                f"{type(engine).__name__}.{method} raised {type(exc).__name__}: {exc}",
                remote_traceback=_traceback(),
            ) from exc

    def submit(self, task: Any) -> None:
        """Queue ``task.run()`` on the engine thread (``task.cancel()`` if it stops first)."""
        self._thread.submit(task)

    def hold(self) -> None:
        """``EngineThread.hold``: the calling thread's submits wait for ``release``, then
        go to the engine thread together (the RPC server's batch of pipelined calls)."""
        self._thread.hold()

    def release(self, after=None, finished=None) -> None:
        self._thread.release(after, finished)

    def holding(self) -> bool:
        return self._thread.holding()

    def busy_here(self) -> bool:
        """``on_engine_thread() or holding()``: nothing the caller does may wait for the
        engine thread."""
        return self._thread.busy_here()

    def call(
        self, name: str, method: str, args: list, kwargs: dict, broadcast: bool | None = None
    ) -> Any:
        """Run ``method`` of engine ``name``. ``broadcast`` (the call's
        ``rpc_meta["broadcast"]``; None: AReaL's default) first replaces the arguments with
        the engine's data-parallel head's (corral.worker.broadcast)."""
        engine, fn = self._method(name, method)
        if not is_coroutine_method(fn):
            return self._on_engine_thread(
                self._run_sync, engine, name, method, fn, broadcast, args, kwargs
            )
        args, kwargs = self._on_engine_thread(
            self._arguments, engine, name, method, broadcast, args, kwargs
        )
        try:
            return self._await(fn(*args, **kwargs))
        except Exception as exc:
            raise EngineCallError(
                f"{type(engine).__name__}.{method} raised {type(exc).__name__}: {exc}",
                remote_traceback=_traceback(),
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
                    if _awaitable(result):
                        self._await(result)
                except Exception as exc:
                    problems.append(f"{name}: {type(exc).__name__}: {exc}")
        return problems

    def notify(self, method: str, *args: Any) -> list[str]:
        """Call ``method(*args)`` on every engine that defines it (e.g. ``on_preempt``);
        returns the problems, never raises."""
        problems = []
        for name, engine in list(self.engines.items()):
            fn = getattr(engine, method, None)
            if not callable(fn):
                continue
            try:
                result = self._on_engine_thread(fn, *args)
                if _awaitable(result):
                    self._await(result)
            except Exception as exc:
                problems.append(f"{name}.{method}: {type(exc).__name__}: {exc}")
        return problems

    def close(self) -> None:
        self._thread.close()
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)


async def _as_coroutine(awaitable) -> Any:
    return await awaitable
