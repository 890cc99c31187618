"""The exception family. Every error names the worker, the role, and what to do."""

from __future__ import annotations


class CorralError(Exception):
    """Base of every corral error."""


class ConfigError(CorralError, ValueError):
    """Invalid user input: names the field, the value, and the fix."""

    def __init__(self, field: str, value: object, fix: str):
        self.field = field
        self.value = value
        self.fix = fix
        super().__init__(f"{field}={value!r} is invalid: {fix}")


class SchedulerError(CorralError):
    """A scheduler could not do what it was asked."""


class WorkerCreationError(SchedulerError):
    """Workers could not be placed or started."""


class WorkerTimeoutError(SchedulerError, TimeoutError):
    """A worker did not become ready or answer within its deadline."""


class WorkerFailedError(SchedulerError):
    """A worker process died. Carries its exit code and the tail of its log."""

    def __init__(
        self,
        worker_id: str,
        reason: str,
        exit_code: int | None = None,
        log_tail: str = "",
        log_path: str | None = None,
    ):
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
        super().__init__(msg)


class WorkerConnectionError(SchedulerError, ConnectionError):
    """The connection to a worker broke or was refused, but the worker is not known to be dead."""


class WorkerNotFoundError(SchedulerError, KeyError):
    """No worker or role by that name."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "worker not found"


class EngineCreationError(SchedulerError):
    """The engine class was found but constructing it raised."""


class EngineImportError(EngineCreationError, ImportError):
    """The engine's import path could not be imported on the worker."""


class EngineCallError(SchedulerError):
    """An engine method raised on the worker. Carries the remote traceback."""

    def __init__(self, message: str, remote_traceback: str = ""):
        self.remote_traceback = remote_traceback
        text = message
        if remote_traceback:
            text += "\n--- remote traceback ---\n" + remote_traceback.rstrip()
        super().__init__(text)


class ProtocolError(CorralError):
    """A malformed frame or HTTP message on the wire."""


class AuthenticationError(CorralError):
    """The worker refused the request: the trial secret was missing or wrong."""


class NameResolveError(CorralError):
    """Name-resolve could not be reached or refused an operation."""


class TrialInUseError(SchedulerError):
    """Another live controller runs this experiment/trial; names that run and how to proceed."""

    def __init__(self, message: str, holder: object = None):
        self.holder = holder
        super().__init__(message)


class PlacementError(ConfigError, WorkerCreationError):
    """A request that can never be placed on this cluster (more than it has in total, or a
    queue reason that cannot clear). Raised within seconds, never after a timeout."""


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
