"""A stop request that signal handlers may set: the first reason wins, the main thread waits.

Why not ``threading.Event``: ``Event.set`` takes the event's lock, and a Python signal
handler runs in the main thread between two bytecodes of whatever it interrupted. When that
was code holding the same lock (the main thread inside ``Event.wait``, or an earlier
handler inside ``Event.set`` when two signals come close together, e.g. the parent-death
SIGTERM and another one), the handler waits for a lock its own thread holds: the worker
hangs for ever, before its stop watchdog is armed. ``set`` here takes no lock: it appends
to a list (atomic) and writes one byte to a pipe (async-signal-safe); ``wait`` reads the
pipe, which a signal interrupts and Python retries after running the handler (PEP 475).
"""

from __future__ import annotations

import os


class StopLatch:
    """Set from signal handlers and threads (``set(reason)``), waited on by one thread."""

    def __init__(self) -> None:
        self.reasons: list[str] = []
        self._read, self._write = os.pipe()  # not inherited by children (PEP 446)
        os.set_blocking(self._write, False)

    def set(self, reason: str) -> None:
        self.reasons.append(reason)
        try:
            os.write(self._write, b"\0")
        except OSError:  # the pipe is full: the waiter has bytes to wake on already
            pass

    def is_set(self) -> bool:
        return bool(self.reasons)

    @property
    def reason(self) -> str:
        """The first reason given ("" before any)."""
        return self.reasons[0] if self.reasons else ""

    def wait(self) -> str:
        """Block until the latch is set; the first reason."""
        while not self.reasons:
            os.read(self._read, 64)
        return self.reasons[0]
