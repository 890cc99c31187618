"""A worker's start (import, settings, bind, register) imports nothing that must stay lazy.

In-process, starting no process: corral's modules and the lazy third-party packages are
taken out of ``sys.modules`` for the test (and put back after it), and an import hook
refuses every module of the lazy list, so a fresh import of the worker runtime that
reaches one of them is seen. The standard-library modules a worker's start must not load
(``dataclasses``, ``typing``, ``logging``...) cannot be checked in a process that has
them loaded already: tests/integration/test_worker_start_imports.py checks those in a
real worker process.
"""

from __future__ import annotations

import importlib.abc
import json
import os
import sys
import threading

#: loaded on first use only, never by a worker's start
MUST_STAY_LAZY = (
    "torch", "ray", "numpy", "yaml", "rich", "cryptography", "psutil",
    # the data plane, the live view, the controller's config and scheduler, the backends
    "corral.data.store", "corral.data.fetch", "corral.data.relay", "corral.data.routes",
    "corral.data.plane", "corral.observe", "corral.config", "corral.spec",
    "corral.backends", "corral.controller.scheduler", "corral.launcher", "corral.envvars",
    "corral.worker.fork", "corral.worker.args", "corral.procs", "corral.logs",
)  # fmt: skip


def _lazy(name: str) -> bool:
    return any(name == m or name.startswith(m + ".") for m in MUST_STAY_LAZY)


def _ours(name: str) -> bool:
    return name == "corral" or name.startswith("corral.") or _lazy(name)


class _RefuseLazy(importlib.abc.MetaPathFinder):
    """Refuses (and records) the imports of the lazy list made by the test's thread."""

    def __init__(self) -> None:
        self.thread = threading.get_ident()
        self.asked: list[str] = []

    def find_spec(self, name, path=None, target=None):
        if _lazy(name) and threading.get_ident() == self.thread:
            self.asked.append(name)
            raise ImportError(f"{name} must stay lazy in a worker's start")
        return None


def _fresh_start(tmp_path, then=None) -> list[str]:
    """Start a worker runtime from freshly imported modules; the lazy imports it asked for.
    ``then(runtime)`` runs after the start, inside the same watch (the check's own test)."""
    # a copy first (one C call): another test's leftover thread may import meanwhile
    saved = {n: m for n, m in sys.modules.copy().items() if _ours(n)}
    for name in saved:
        del sys.modules[name]
    refuse = _RefuseLazy()
    sys.meta_path.insert(0, refuse)
    runtime = None
    try:
        from corral.worker import env as E
        from corral.worker import runtime as R

        secret_file = tmp_path / "secret"
        secret_file.write_text("s" * 64)
        os.chmod(secret_file, 0o600)
        environ = {
            E.EXPERIMENT: "lazy",
            E.TRIAL: "t0",
            E.ROLE: "w",
            E.INDEX: "0",
            E.NAME_RESOLVE: json.dumps({"type": "nfs", "root": str(tmp_path / "records")}),
            E.SECRET_FILE: str(secret_file),
            E.BIND_HOST: "127.0.0.1",
        }
        settings = E.WorkerSettings.from_env(environ)
        runtime = R.WorkerRuntime(settings, E.read_secret(environ))
        runtime.start()  # binds, serves, registers in name-resolve
        R.ControllerWatch(runtime, lambda why: None)
        assert runtime.name_resolve.get("lazy/t0/w/0") == runtime.address
        if then is not None:
            then(runtime)
    finally:
        sys.meta_path.remove(refuse)
        if runtime is not None:
            runtime.stop()
        for name in [n for n in sys.modules.copy() if _ours(n)]:
            del sys.modules[name]
        sys.modules.update(saved)
    return refuse.asked


def test_a_worker_start_imports_nothing_that_must_stay_lazy(tmp_path):
    assert _fresh_start(tmp_path) == []


def test_the_check_sees_the_data_plane_loaded_by_the_first_engine(tmp_path):
    """The check itself: what a worker loads on first use (here the data plane, made for
    an engine) is seen and refused."""

    def first_engine(runtime) -> None:
        try:
            runtime.data.get()
        except ImportError:
            pass

    assert "corral.data.store" in _fresh_start(tmp_path, first_engine)
