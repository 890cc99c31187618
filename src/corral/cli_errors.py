"""How the ``corral`` command reports an error: one or two lines, not a traceback.

Bad input (a ``ConfigError``: a config field, a YAML file, a name, a placement that can
never fit) exits 2; anything that failed at run time exits 1. ``--debug`` or
``CORRAL_DEBUG=1`` re-raises, so the traceback is printed as Python prints it.
"""

from __future__ import annotations

import os

from corral.errors import ConfigError, CorralError

BAD_INPUT = 2
RUN_TIME_FAILURE = 1
DEBUG_ENV = "CORRAL_DEBUG"
MAX_LINE = 400  # characters of one message line; a value's repr can be huge


def debug_wanted(flag: bool) -> bool:
    """``--debug`` given, or ``CORRAL_DEBUG`` set to anything but "" or "0"."""
    return flag or os.environ.get(DEBUG_ENV, "") not in ("", "0")


def _clip(text: str) -> str:
    text = " ".join(text.split())  # one line, whatever the message held
    return text if len(text) <= MAX_LINE else text[: MAX_LINE - 3] + "..."


def short_error(exc: BaseException) -> tuple[int, str]:
    """(exit code, one line): what was wrong, and the fix where the error names one."""
    if isinstance(exc, ConfigError):
        value = repr(exc.value)
        if len(value) > 120:
            value = value[:117] + "..."
        return BAD_INPUT, _clip(f"{exc.field}={value} is invalid: {exc.fix}")
    if isinstance(exc, CorralError):
        return RUN_TIME_FAILURE, _clip(f"{type(exc).__name__}: {exc}")
    if isinstance(exc, FileNotFoundError):
        return BAD_INPUT, _clip(f"{exc.filename or exc}: no such file; check the path")
    if isinstance(exc, PermissionError):
        return RUN_TIME_FAILURE, _clip(
            f"{exc.filename or exc}: permission denied; check its owner and mode"
        )
    return RUN_TIME_FAILURE, _clip(f"{type(exc).__name__}: {exc}")


def report(command: str, exc: BaseException, print_err) -> int:
    """Print the short form of ``exc`` for ``corral COMMAND``; return the exit code."""
    code, line = short_error(exc)
    print_err(f"corral {command}: {line}")
    print_err(f"  (run with --debug or {DEBUG_ENV}=1 for the traceback)")
    return code
