"""An AReaL exceptions module that re-exports corral's own classes (an import shim, a
re-export, a test double) must not break corral's errors: a twin is never built from a
class that is already among its bases (issue 24, defect 1)."""

from __future__ import annotations

import sys
import types

import pytest

from corral import errors

SHIMMED = (
    "SchedulerError", "WorkerCreationError", "WorkerFailedError", "WorkerNotFoundError",
    "EngineCreationError", "EngineCallError", "WorkerTimeoutError", "GPUAllocationError",
)  # fmt: skip


def install(monkeypatch, **classes: type) -> types.ModuleType:
    module = types.ModuleType(errors.AREAL_EXCEPTIONS)
    for name, cls in classes.items():
        setattr(module, name, cls)
    monkeypatch.setitem(sys.modules, errors.AREAL_EXCEPTIONS, module)
    return module


def test_a_module_reexporting_corrals_classes_leaves_them_corrals(monkeypatch):
    install(monkeypatch, **{name: getattr(errors, name) for name in SHIMMED})
    for cls, args in (
        (errors.WorkerNotFoundError, ("ghost/0",)),
        (errors.UnknownRoleError, ("target", "x", "create it first")),
        (errors.EngineNotFoundError, ("no engine named 'e'",)),
        (errors.GPURequestError, ("gpu", 9, "fewer")),
        (errors.WorkerFailedError, ("w/0", 1, "tail")),
    ):
        exc = cls(*args)  # raised TypeError: duplicate base class WorkerNotFoundError
        assert type(exc) is cls


def test_a_partial_shim_adds_only_areals_own_classes(monkeypatch):
    class ArealSchedulerError(Exception):
        pass

    class ArealEngineCallError(ArealSchedulerError):
        pass

    install(
        monkeypatch,
        SchedulerError=ArealSchedulerError,
        WorkerNotFoundError=errors.WorkerNotFoundError,  # re-exported corral class
        EngineCallError=ArealEngineCallError,
    )
    exc = errors.EngineNotFoundError("no engine named 'e' on this worker")
    assert isinstance(exc, errors.WorkerNotFoundError) and isinstance(exc, ArealEngineCallError)
    assert type(exc).__bases__.count(errors.WorkerNotFoundError) == 0
    with pytest.raises(ArealSchedulerError):
        raise errors.WorkerNotFoundError("ghost/0")
