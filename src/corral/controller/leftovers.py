"""Remove what a dead controller's run left under a trial, before a new run starts there.

Three kinds of leftovers, found without trusting the dead run's memory:

* workers still registered in name-resolve: asked to exit with the old run's secret
  (``POST /shutdown``); on this host, ones that do not exit are SIGKILLed by pid after
  checking ``/proc/<pid>/environ`` names this experiment and trial;
* backend objects named after the trial (Slurm jobs ``exp:trial:*``, Ray actors and
  placement groups): ``Launcher.remove_leftovers``;
* the trial's name-resolve entries.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
from collections.abc import Callable

from corral import identity, name_resolve_keys
from corral.controller.run_lease import Lease, registered_workers
from corral.discovery import NameResolve
from corral.procs import pid_alive

log = logging.getLogger("corral")
EXIT_WAIT_SECONDS = 3.0


def _is_trial_worker(pid: int, experiment: str, trial: str) -> bool:
    """Does ``pid`` (on this host) run a corral worker of this trial, as this user?"""
    return identity.matches(pid, experiment=experiment, trial=trial)


def clean_dead_run(
    nr: NameResolve,
    experiment: str,
    trial: str,
    old: Lease,
    old_secret: str | None,
    remove_backend: Callable[[str, str], list[str]],
) -> list[str]:
    """Remove the leftovers of the dead run ``old``; returns one line per thing removed."""
    removed: list[str] = []
    workers = registered_workers(nr, experiment, trial)
    here = socket.gethostname()
    local_pids: dict[str, int] = {}
    if workers and old_secret:
        from corral.rpc.client import RPCClient

        client = RPCClient(old_secret)
        try:
            for wid, info in sorted(workers.items()):
                address = info.get("address")
                if not address:
                    continue
                try:
                    client.request(address, "/shutdown", {}, timeout=1.0)
                    removed.append(
                        f"worker {wid} of run {info.get('run_id') or old.run_id or '?'} "
                        f"(pid {info.get('pid', '?')} on {info.get('host', '?')}): asked to exit"
                    )
                except Exception as exc:
                    log.debug("old worker %s at %s: %s", wid, address, exc)
        finally:
            client.close()
    for wid, info in workers.items():
        pid = info.get("pid")
        if info.get("host") == here and isinstance(pid, int) and pid_alive(pid):
            local_pids[wid] = pid
    try:
        removed += remove_backend(experiment, trial)
    except Exception as exc:
        log.warning("removing the backend leftovers of %s/%s: %s", experiment, trial, exc)
    deadline = time.monotonic() + EXIT_WAIT_SECONDS
    while any(pid_alive(p) for p in local_pids.values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    for wid, pid in local_pids.items():
        if pid_alive(pid) and _is_trial_worker(pid, experiment, trial):
            try:
                os.kill(pid, signal.SIGKILL)
                removed.append(f"worker {wid} (pid {pid}): SIGKILLed, it did not exit")
            except ProcessLookupError:
                pass
    root = name_resolve_keys.trial_root(experiment, trial)
    entries = [k for k in nr.get_subtree(root) if not k.endswith("/_controller")]
    if entries:
        for key in list(nr.get_subtree(root)):
            if not key.endswith("/_controller"):
                nr.delete(key)
        removed.append(f"{len(entries)} name-resolve entr{'y' if len(entries) == 1 else 'ies'}")
    return removed
