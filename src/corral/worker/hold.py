"""Keep a Slurm allocation while its controller lives: ``python -m corral.worker.hold``.

A role that may restart its workers ends its batch script with this process, so that the
job (and its nodes and GPUs) stays allocated after its step ended and a dead replica can
be started again inside it (``srun --jobid ... --overlap``). It exits as soon as the
controller is lost (lease gone, stale, or taken by another run) or on SIGTERM (scancel).
"""

from __future__ import annotations

import signal
import sys
import threading

from corral.discovery import make_name_resolve
from corral.worker.env import WorkerSettings
from corral.worker.latch import StopLatch


class _Holder:
    """The smallest thing ControllerWatch can watch: settings, a store, a stop event."""

    def __init__(self, settings: WorkerSettings):
        self.settings = settings
        self.name_resolve = make_name_resolve(settings.name_resolve)
        self.stopped = threading.Event()


def main() -> int:
    from corral.worker.controller_watch import ControllerWatch

    holder = _Holder(WorkerSettings.from_env())
    lost = StopLatch()  # set by the SIGTERM handler: no threading.Event there (latch.py)

    signal.signal(signal.SIGTERM, lambda *_: lost.set("SIGTERM"))
    # the watch reads name-resolve, which may hang: SIGTERM must not wait for it
    threading.Thread(target=ControllerWatch(holder, lost.set).run, daemon=True).start()
    why = lost.wait()
    holder.stopped.set()
    print(f"corral: allocation released: {why}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
