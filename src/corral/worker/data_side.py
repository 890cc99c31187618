"""The worker's side of the data plane (refs, ``keep``, ``/data/*``), made on first use.

A worker that never hosts an engine, keeps a value or is asked for one never imports the
data plane (store, relay, fetch, shared-memory routes): ``WorkerData.make`` is called by
the runtime when an engine is created, a call carries refs or ``keep``, or a ``/data``
route is asked for.
"""

from __future__ import annotations

import threading


class WorkerData:
    """The store of values kept on this worker, its relays, routes and ref resolver."""

    def __init__(self, settings, generation: str, name_resolve, secret: str):
        from corral.data import store as data_store
        from corral.data.fetch import RefResolver
        from corral.data.relay import Relays
        from corral.data.routes import DataRoutes

        s = settings
        self.store = data_store.ObjectStore(s.worker_id, generation, f"{s.experiment}/{s.trial}")
        data_store.install(self.store)  # corral.data.keep() in engine code finds it
        self.relays = Relays()
        self.routes = DataRoutes(self.store, self.relays)
        self.refs = RefResolver(
            self.store, s.experiment, s.trial, name_resolve, secret, self.relays
        )
        self.parse_keep = data_store.parse_keep


class LazyWorkerData:
    """Holds the ``WorkerData`` of one runtime once something needs it."""

    def __init__(self, settings, generation: str, name_resolve, secret: str):
        self._args = (settings, generation, name_resolve, secret)
        self._made: WorkerData | None = None
        self._lock = threading.Lock()

    @property
    def made(self) -> WorkerData | None:
        """The data plane if it was made, else None (nothing was kept: nothing to clear)."""
        return self._made

    def get(self) -> WorkerData:
        made = self._made
        if made is None:
            with self._lock:
                if self._made is None:
                    self._made = WorkerData(*self._args)
                made = self._made
        return made
