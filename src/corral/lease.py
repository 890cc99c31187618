"""The controller's lease: a heartbeat in name-resolve that workers watch.

A worker whose controller stops renewing it for ``lease_timeout`` seconds exits."""

from __future__ import annotations

import json
import logging
import os
import socket
import threading

from corral.discovery.base import NameResolve

log = logging.getLogger("corral")
LEASE_BEAT_SECONDS = 1.0


class ControllerLease:
    def __init__(self, name_resolve: NameResolve, key: str):
        self.name_resolve = name_resolve
        self.key = key
        self._stop: threading.Event | None = None

    def hold(self) -> None:
        """Write the lease and renew it every second until ``drop`` (no-op if held)."""
        if self._stop is not None:
            return
        self._stop = threading.Event()
        beat = {"pid": os.getpid(), "host": socket.gethostname(), "n": 0}
        self.name_resolve.add(self.key, json.dumps(beat), replace=True)

        def renew(stop: threading.Event) -> None:
            while not stop.wait(LEASE_BEAT_SECONDS):
                beat["n"] += 1
                try:
                    self.name_resolve.add(self.key, json.dumps(beat), replace=True)
                except Exception as exc:
                    log.warning("could not renew the controller lease: %s", exc)

        threading.Thread(target=renew, args=(self._stop,), name="corral-lease", daemon=True).start()

    def drop(self) -> None:
        if self._stop is None:
            return
        self._stop.set()
        self._stop = None
        try:
            self.name_resolve.delete(self.key)
        except Exception:
            pass
