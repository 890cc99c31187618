"""The exception family. Every error names the worker, the role, and what to do.

The scheduler errors also take the constructor arguments and carry the attributes of
AReaL 1.0.4's ``areal.infra.scheduler.exceptions`` classes of the same name (for example
``WorkerFailedError(worker_id, exit_code, stderr)`` with ``.exit_code`` and ``.stderr``),
so code written against AReaL can build, raise and inspect them unchanged. corral's own
form (one readable message plus keyword details) is accepted too. Bad input that AReaL
reports as a creation or lookup error is raised as a class that is both a ``ConfigError``
and the AReaL-named class (:class:`JobConfigError`, :class:`UnknownRoleError`).

``except`` clauses naming AReaL's classes catch corral's errors too, once AReaL's module is
loaded: see :class:`SchedulerError`. corral never imports AReaL itself.
"""

from __future__ import annotations

import sys
import threading

#: Where AReaL 1.0.4 defines its scheduler exceptions (never imported by corral).
AREAL_EXCEPTIONS = "areal.infra.scheduler.exceptions"


class CorralError(Exception):
    """Base of every corral error."""


class ConfigError(CorralError, ValueError):
    """Invalid user input: names the field, the value, and the fix."""

    def __init__(self, field: str, value: object, fix: str):
        self.field = field
        self.value = value
        self.fix = fix
        Exception.__init__(self, f"{field}={value!r} is invalid: {fix}")


class SchedulerError(CorralError):
    """A scheduler could not do what it was asked.

    When AReaL's exceptions module is loaded in this process (``areal`` imported by the
    user's code or AReaL's controllers), every scheduler error corral creates is an
    instance of a subclass of its corral class and of AReaL's classes of the same names
    (``WorkerFailedError`` -> ``areal...WorkerFailedError``; a class without an AReaL
    namesake -> AReaL's ``SchedulerError``), made on first use and cached, so AReaL-style
    ``except`` clauses catch it. Its name, message and attributes are corral's."""

    def __new__(cls, *args, **kwargs):
        areal = sys.modules.get(AREAL_EXCEPTIONS)
        if areal is not None:
            cls = _areal_twin(cls, areal)
        # no arguments: OSError's __new__ would read (errno, strerror) from them
        return super().__new__(cls)

    def __reduce__(self):
        # a twin pickles as its corral class (rebuilt as a twin where AReaL is loaded)
        reduced = super().__reduce__()
        return (type(self).__dict__.get("_corral_class", type(self)), *reduced[1:])


_twins: dict[tuple[type, type], type] = {}
_twins_lock = threading.Lock()


def _areal_twin(cls: type, areal) -> type:
    """``cls`` plus AReaL's classes named like the corral classes it derives from."""
    if "_corral_class" in cls.__dict__:
        return cls
    areal_base = getattr(areal, "SchedulerError", None)
    if not isinstance(areal_base, type):  # a partial import: leave the class alone
        return cls
    key = (cls, areal_base)
    twin = _twins.get(key)
    if twin is not None:
        return twin
    names = [k.__name__ for k in cls.__mro__ if k.__module__ == __name__]
    found = [getattr(areal, n) for n in names if isinstance(getattr(areal, n, None), type)]
    # an AReaL module that re-exports corral's own classes (an import shim, a test double)
    # names classes ``cls`` already derives from: those add nothing and would be duplicates
    found = [a for a in dict.fromkeys(found) if not issubclass(cls, a)]
    found = [a for a in found if not any(b is not a and issubclass(b, a) for b in found)]
    if not found and issubclass(cls, areal_base):
        return cls
    namespace = {
        "_corral_class": cls,
        "__module__": cls.__module__,
        "__qualname__": cls.__qualname__,
        "__doc__": cls.__doc__,
    }
    with _twins_lock:
        return _twins.setdefault(key, type(cls.__name__, (cls, *found), namespace))


def _with_details(message: str, details: str) -> str:
    return f"{message}\n{details}" if details else message


class WorkerCreationError(SchedulerError):
    """Workers could not be placed or started.

    ``WorkerCreationError(worker_key, reason, details="")`` (AReaL's form) or
    ``WorkerCreationError(message)``."""

    def __init__(self, worker_key: str, reason: str | None = None, details: str = ""):
        if reason is None:  # corral's one-message form
            self.worker_key, self.reason, self.details = None, worker_key, ""
            Exception.__init__(self, worker_key)
            return
        self.worker_key, self.reason, self.details = worker_key, reason, details
        Exception.__init__(
            self, _with_details(f"cannot create workers of {worker_key!r}: {reason}", details)
        )


class WorkerConfigurationError(SchedulerError):
    """A started worker refused or failed its configuration (``/configure``)."""

    def __init__(self, worker_key: str, reason: str = "", details: str = ""):
        self.worker_key, self.reason, self.details = worker_key, reason, details
        Exception.__init__(
            self, _with_details(f"configuring worker {worker_key!r} failed: {reason}", details)
        )


class WorkerTimeoutError(SchedulerError, TimeoutError):
    """A worker did not become ready or answer within its deadline.

    ``WorkerTimeoutError(worker_key, timeout)`` as in AReaL; corral adds its own
    explanation as ``message`` (``WorkerTimeoutError(text)`` alone is a message)."""

    def __init__(self, worker_key: str, timeout: float | None = None, message: str | None = None):
        if timeout is None and message is None:  # one message
            worker_key, message = None, worker_key
        self.worker_key = worker_key
        self.timeout = timeout
        Exception.__init__(self, message or f"worker {worker_key!r} not ready after {timeout}s")


class WorkerFailedError(SchedulerError):
    """A worker process died. Carries its exit code and the tail of its log.

    ``WorkerFailedError(worker_id, exit_code, stderr="")`` as in AReaL; corral adds
    ``reason`` (what happened) and ``log_path``. ``stderr`` is the tail of the worker's
    log (corral merges a worker's output), also known as ``log_tail``."""

    def __init__(
        self,
        worker_id: str,
        exit_code: int | None = None,
        stderr: str = "",
        *,
        reason: str = "exited",
        log_path: str | None = None,
    ):
        self.worker_id = worker_id
        self.reason = reason
        self.exit_code = exit_code
        self.stderr = stderr or ""
        self.log_path = log_path
        self.restarted = False
        msg = f"worker {worker_id} failed: {reason}"
        if exit_code is not None:
            msg += f" (exit code {exit_code})"
        if log_path:
            msg += f"; full log: {log_path}"
        if stderr:
            msg += "\n--- last lines of its log ---\n" + stderr.rstrip()
        Exception.__init__(self, msg)

    @property
    def log_tail(self) -> str:
        return self.stderr


class RPCConnectionError(SchedulerError, ConnectionError):
    """The connection to a worker failed (AReaL's name and form:
    ``RPCConnectionError(worker_id, host, port, reason)``)."""

    def __init__(
        self,
        worker_id: str,
        host: str | None = None,
        port: int | None = None,
        reason: str | None = None,
    ):
        if host is None and port is None and reason is None:  # corral's one-message form
            self.worker_id = self.host = self.port = None
            self.reason = worker_id
            Exception.__init__(self, worker_id)
            return
        self.worker_id, self.host, self.port, self.reason = worker_id, host, port, reason
        Exception.__init__(self, f"cannot reach worker {worker_id!r} at {host}:{port}: {reason}")


class WorkerConnectionError(RPCConnectionError):
    """The connection to a worker broke or was refused, but the worker is not known to be dead."""


class WorkerNotFoundError(SchedulerError, KeyError):
    """No worker or role by that name.

    ``WorkerNotFoundError(worker_id)`` as in AReaL; corral adds ``message`` (a single
    argument with spaces in it is taken as the message)."""

    def __init__(self, worker_id: str = "", message: str | None = None):
        if message is None and " " in str(worker_id):
            worker_id, message = None, worker_id
        self.worker_id = worker_id
        Exception.__init__(self, message or f"no worker or role {worker_id!r}")

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "worker not found"


class EngineCreationError(SchedulerError):
    """The engine class was found but constructing it raised.

    ``EngineCreationError(worker_id, reason, status_code=None)`` (AReaL's form) or
    ``EngineCreationError(message)``."""

    def __init__(self, worker_id: str, reason: str | None = None, status_code: int | None = None):
        if reason is None:
            self.worker_id, self.reason = None, worker_id
            message = worker_id
        else:
            self.worker_id, self.reason = worker_id, reason
            message = f"creating an engine on worker {worker_id!r} failed: {reason}"
            if status_code:
                message += f" (status {status_code})"
        self.status_code = status_code
        Exception.__init__(self, message)


class EngineImportError(EngineCreationError, ImportError):
    """The engine's import path could not be imported on the worker.

    ``EngineImportError(import_path, reason)`` (AReaL's form) or ``EngineImportError(message)``."""

    def __init__(self, import_path: str, reason: str | None = None):
        if reason is None:
            self.import_path = None
            EngineCreationError.__init__(self, import_path)
        else:
            self.import_path = import_path
            EngineCreationError.__init__(self, f"cannot import engine {import_path!r}: {reason}")
        self.reason = reason if reason is not None else import_path
        self.msg = str(self.args[0])


class EngineCallError(SchedulerError):
    """An engine method raised on the worker. Carries the remote traceback.

    ``EngineCallError(worker_id, method, reason, attempt=1)`` as in AReaL;
    ``EngineCallError(message, remote_traceback=...)`` is corral's one-message form."""

    def __init__(
        self,
        worker_id: str,
        method: str | None = None,
        reason: str | None = None,
        attempt: int = 1,
        *,
        remote_traceback: str = "",
    ):
        if method is None and reason is None:  # one message
            message, worker_id, reason = worker_id, None, worker_id
        else:
            message = f"calling {method!r} on worker {worker_id!r} failed: {reason}"
            if attempt > 1:
                message += f" ({attempt} attempts)"
        self.worker_id, self.method, self.reason, self.attempt = worker_id, method, reason, attempt
        self.remote_traceback = remote_traceback
        if remote_traceback:
            message += "\n--- remote traceback ---\n" + remote_traceback.rstrip()
        Exception.__init__(self, message)


class EngineNotFoundError(WorkerNotFoundError, EngineCallError):
    """No engine by that name on the worker. A ``WorkerNotFoundError`` (corral's lookup
    error) and an ``EngineCallError`` (what AReaL raises after its worker's HTTP 404), so
    either ``except`` catches it."""

    def __init__(self, message: str, worker_id: str | None = None, method: str | None = None):
        self.worker_id, self.method, self.reason, self.attempt = worker_id, method, message, 1
        self.remote_traceback = ""
        Exception.__init__(self, message)


class PortAllocationError(SchedulerError):
    """No free ports could be reserved (AReaL's name and form: ``PortAllocationError(reason)``)."""

    def __init__(self, reason: str):
        self.reason = reason
        Exception.__init__(self, f"cannot reserve ports: {reason}")


class GPUAllocationError(SchedulerError):
    """Not enough GPUs for a request (AReaL's name and form: ``GPUAllocationError(reason)``)."""

    def __init__(self, reason: str):
        self.reason = reason
        Exception.__init__(self, f"cannot give out GPUs: {reason}")


class JobConfigError(ConfigError, WorkerCreationError):
    """A job refused before anything starts. Both a ``ConfigError`` (corral) and a
    ``WorkerCreationError`` (what AReaL raises for the same input)."""

    def __init__(self, field: str, value: object, fix: str, role: str | None = None):
        ConfigError.__init__(self, field, value, fix)
        self.worker_key, self.reason, self.details = role, fix, ""


class PlacementError(JobConfigError):
    """A request that can never be placed on this cluster (more than it has in total, or a
    queue reason that cannot clear). Raised within seconds, never after a timeout."""


class GPURequestError(PlacementError, GPUAllocationError):
    """A job asks for more GPUs than there are (AReaL raises GPUAllocationError)."""


class UnknownRoleError(JobConfigError, WorkerNotFoundError):
    """A job names a colocation target that does not exist (or none). A ``ConfigError``,
    and both classes AReaL raises for it (``WorkerNotFoundError``, ``WorkerCreationError``)."""

    def __init__(self, field: str, value: object, fix: str, role: str | None = None):
        JobConfigError.__init__(self, field, value, fix, role)
        self.worker_id = value

    def __str__(self) -> str:
        return str(self.args[0])


class EngineTypeError(ConfigError, EngineCreationError):
    """``create_engine`` got something that is not an import path or a class (AReaL
    raises EngineCreationError for it)."""

    def __init__(self, field: str, value: object, fix: str):
        ConfigError.__init__(self, field, value, fix)
        self.worker_id, self.reason, self.status_code = None, fix, None


class ProtocolError(CorralError):
    """A malformed frame or HTTP message on the wire."""


class AuthenticationError(CorralError):
    """The worker refused the request: the trial secret was missing or wrong."""


class NameResolveError(CorralError):
    """Name-resolve could not be reached or refused an operation."""


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class TrialInUseError(SchedulerError):
    """Another live controller runs this experiment/trial; names that run and how to proceed."""

    def __init__(self, message: str, holder: object = None):
        self.holder = holder
        super().__init__(message)


class WorkerPreemptedError(WorkerFailedError):
    """The worker was preempted (its Slurm job requeued, its Ray node lost). Calls to it
    fail with this error until the role is back; ``Scheduler.wait_role(role)`` waits."""


class ResourceLimitError(WorkerCreationError):
    """The controller's own limits (open files, ...) cannot hold the workers asked for;
    names the limit, its value and how to raise it."""


class RefError(CorralError):
    """A ``corral.Ref`` that cannot be used: freed, from another trial, or unknown to its
    owner (never made there, or forged)."""


class RefLostError(RefError):
    """The worker that owns a ``corral.Ref`` died, was restarted or deleted: the value is gone."""

    def __init__(self, message: str, owner: str = ""):
        self.owner = owner
        super().__init__(message)

    def __reduce__(self):
        return (type(self), (self.args[0] if self.args else "", self.owner))


class ProcessGroupError(CorralError):
    """A cross-role process group (``Scheduler.create_process_group``) could not be made,
    found or used; names the group, the members concerned and what to do."""
