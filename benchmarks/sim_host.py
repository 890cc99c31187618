"""One process serving many lightweight simulated corral workers (the scale benchmark).

    python benchmarks/sim_host.py SPEC.json

``SPEC.json``: ``{"env": {...worker env...}, "first": i, "count": n, "engine": path}``.
Each simulated worker is a real ``WorkerRuntime``: its own RPC server on its own port (the
real worker protocol, authentication and result cache) registered under its own role index
in the real name-resolve. What is shared, to make thousands fit on a small machine: the
process, and one engine host (so one engine thread) per process. ``POST /shutdown`` stops
just that worker; SIGTERM stops them all and exits. Prints ``ready`` when all serve.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading


def main(spec_path: str) -> None:
    with open(spec_path) as fh:
        spec = json.load(fh)
    os.environ.update(spec["env"])
    # one usage report per process, not per simulated worker: every simulated worker's
    # reporter would measure this same process (256 psutil walks every 5 s per host)
    os.environ["CORRAL_STATS"] = "0"
    from corral.worker.engines import EngineHost
    from corral.worker.env import WorkerSettings, read_secret
    from corral.worker.runtime import WorkerRuntime

    secret = read_secret()
    engines = EngineHost()
    engines.create("main", spec["engine"], [], {})
    engines.destroy_all = lambda: []  # shared by every worker of this process: keep it
    engines.close = lambda: None
    runtimes = []
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    for index in range(spec["first"], spec["first"] + spec["count"]):
        settings = WorkerSettings.from_env({**os.environ, "CORRAL_INDEX": str(index)})
        runtime = WorkerRuntime(settings, secret, engines=engines)
        runtime._on_shutdown = _stopper(runtime, in_thread=True)
        runtime.start()
        runtimes.append(runtime)
    print("ready", flush=True)
    stop.wait()
    for runtime in runtimes:
        _stopper(runtime)()
    os._exit(0)


_stop_lock = threading.Lock()


def _stopper(runtime, in_thread: bool = False):
    """Stop ``runtime`` once, whoever asks first (its /shutdown or the host's SIGTERM)."""

    def stop() -> None:
        with _stop_lock:
            if getattr(runtime, "_sim_stopping", False):
                return
            runtime._sim_stopping = True
        runtime.stop()

    if in_thread:
        return lambda: threading.Thread(target=stop, daemon=True).start()
    return stop


if __name__ == "__main__":
    main(sys.argv[1])
