"""The exception family. Every error names the worker, the role, and what to do.

The scheduler errors also take the constructor arguments and carry the attributes of
AReaL 1.0.4's ``areal.infra.scheduler.exceptions`` classes of the same name (for example
``WorkerFailedError(worker_id, exit_code, stderr)`` with ``.exit_code`` and ``.stderr``),
so code written against AReaL can build, raise and inspect them unchanged. corral's own
form (one readable message plus keyword details) is accepted too. Bad input that AReaL
reports as a creation or lookup error is raised as a class that is both a ``ConfigError``
and the AReaL-named class (:class:`JobConfigError`, :class:`UnknownRoleError`).
"""

from __future__ import annotations

from typing import Any


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
    """A scheduler could not do what it was asked."""


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

    ``WorkerTimeoutError(worker_key, timeout)`` (AReaL's form) or ``WorkerTimeoutError(message,
    worker_key=..., timeout=...)``."""

    def __init__(
        self, message: str, timeout: float | None = None, *, worker_key: str | None = None
    ):
        if timeout is not None and worker_key is None and _is_number(timeout):
            worker_key, message = message, f"worker {message!r} not ready after {timeout}s"
        self.worker_key = worker_key
        self.timeout = timeout
        Exception.__init__(self, message)


class WorkerFailedError(SchedulerError):
    """A worker process died. Carries its exit code and the tail of its log.

    ``WorkerFailedError(worker_id, exit_code, stderr="")`` (AReaL's form) or
    ``WorkerFailedError(worker_id, reason, exit_code=None, log_tail="", log_path=None)``.
    ``stderr`` and ``log_tail`` are the same text (corral merges a worker's output)."""

    def __init__(
        self,
        worker_id: str,
        reason: str | int | None = None,
        exit_code: int | str | None = None,
        log_tail: str = "",
        log_path: str | None = None,
    ):
        if reason is None or _is_number(reason):  # AReaL: (worker_id, exit_code, stderr)
            stderr = exit_code if isinstance(exit_code, str) else log_tail
            reason, exit_code, log_tail = "exited", reason, stderr or ""
        self.worker_id = worker_id
        self.reason = reason
        self.exit_code = exit_code
        self.log_tail = log_tail
        self.log_path = log_path
        self.restarted = False
        msg = f"worker {worker_id} failed: {reason}"
        if exit_code is not None:
            msg += f" (exit code {exit_code})"
        if log_path:
            msg += f"; full log: {log_path}"
        if log_tail:
            msg += "\n--- last lines of its log ---\n" + log_tail.rstrip()
        Exception.__init__(self, msg)

    @property
    def stderr(self) -> str:
        """AReaL's name for the output the worker left (the tail of its log)."""
        return self.log_tail


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

    ``WorkerNotFoundError(worker_id)`` (AReaL's form: a bare id) or
    ``WorkerNotFoundError(message, worker_id=...)``."""

    def __init__(self, message: str = "worker not found", *, worker_id: str | None = None):
        if worker_id is None and " " not in str(message):
            worker_id, message = message, f"no worker or role {message!r}"
        self.worker_id = worker_id
        Exception.__init__(self, message)

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

    ``EngineCallError(worker_id, method, reason, attempt=1)`` (AReaL's form) or
    ``EngineCallError(message, remote_traceback="", worker_id=..., method=...)``."""

    def __init__(
        self,
        message: str,
        *rest: Any,
        remote_traceback: str = "",
        worker_id: str | None = None,
        method: str | None = None,
        attempt: int = 1,
    ):
        if len(rest) >= 2:  # AReaL: (worker_id, method, reason[, attempt])
            worker_id, method, reason = message, rest[0], rest[1]
            attempt = rest[2] if len(rest) > 2 else attempt
            message = f"calling {method!r} on worker {worker_id!r} failed: {reason}"
            if attempt > 1:
                message += f" ({attempt} attempts)"
        else:
            reason = message
            if rest:
                remote_traceback = rest[0]
        self.worker_id, self.method, self.reason, self.attempt = worker_id, method, reason, attempt
        self.remote_traceback = remote_traceback
        text = message
        if remote_traceback:
            text += "\n--- remote traceback ---\n" + remote_traceback.rstrip()
        Exception.__init__(self, text)


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


class GPURequestError(JobConfigError, GPUAllocationError):
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
