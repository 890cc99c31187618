"""A worker that was told to go (SIGTERM, its controller lost, its grace over) goes.

The orderly stop runs engine code (``on_preempt``, ``destroy``) on the engine thread, which
may be busy with a call that never returns, and touches name-resolve and the log pipe,
which may hang. Without a bound such a worker outlived its controller for hours and
ignored SIGTERM (its main thread was already waiting in the stop). So once a worker
decides to stop, a watchdog gives the orderly stop ``STOP_DEADLINE_SECONDS``
(``CORRAL_STOP_DEADLINE`` overrides it; both in ``corral.stop_deadline``); after that, or
on a second SIGTERM/SIGINT, the worker kills its forked children and leaves at once with the exit code it would have had.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable

from corral.stop_deadline import stop_deadline


def _say(text: str) -> None:
    """To stderr without Python's buffers (which the stuck stop may hold locked)."""
    try:
        os.write(2, text.encode() + b"\n")
    except OSError:
        pass


class StopWatchdog:
    """Armed when a worker starts stopping; ends the process if the stop does not."""

    def __init__(
        self,
        who: str,
        kill_children: Callable[[], None] = lambda: None,
        exit: Callable[[int], None] = os._exit,
    ):
        self.who = who
        self.kill_children = kill_children
        self._exit = exit
        self._armed = threading.Event()
        self.code = 0

    def arm(self, code: int, reason: str, deadline: float | None = None) -> None:
        """Start the countdown (once); a second SIGTERM/SIGINT then ends the worker now."""
        if self._armed.is_set():
            return
        self._armed.set()
        self.code = code
        seconds = stop_deadline() if deadline is None else deadline
        timer = threading.Timer(seconds, self.expire, args=(f"stop took over {seconds:g}s",))
        timer.daemon = True
        timer.start()
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(
                    sig, lambda signum, _frame: self.expire(f"second {signal.Signals(signum).name}")
                )

    def expire(self, why: str) -> None:
        _say(
            f"corral worker {self.who}: {why} while stopping (an engine call, destroy() or "
            f"on_preempt() did not return): leaving now with code {self.code}"
        )
        try:
            self.kill_children()
        except Exception:
            pass
        self._exit(self.code)


def kill_process_groups_now(procs: list) -> None:
    """SIGKILL each child's process group (children are group leaders), without waiting."""
    for proc in procs:
        signal_group = getattr(proc, "signal_group", None)
        if signal_group is not None:  # held by a pidfd: only while it is still that process
            signal_group(signal.SIGKILL)
            continue
        for kill in (lambda p=proc: os.killpg(p.pid, signal.SIGKILL), lambda p=proc: p.kill()):
            try:
                kill()
                break
            except (OSError, ProcessLookupError):
                continue


def arm_stop_watchdog(runtime, code: int, reason: str) -> StopWatchdog:
    """For ``corral.worker.runtime.main``: the watchdog of a stopping worker process."""

    def kill_children() -> None:
        kill_process_groups_now(runtime.child_processes())

    watchdog = StopWatchdog(runtime.settings.worker_id, kill_children)
    watchdog.arm(code, reason)
    return watchdog
