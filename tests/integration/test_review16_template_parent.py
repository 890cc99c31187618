"""Review 16: the fork template asks for ``PR_SET_PDEATHSIG``, whose "parent" is the
THREAD that spawned it (prctl(2)), not the worker process. The worker spawns its template
on the thread that serves the first ``/fork``: a blocking client's request runs on its
connection's thread, which ends when that connection closes (the client closes it, or the
worker's idle timeout). ``procs.spawn`` therefore spawns from one long-lived thread; this
guards that: were the template spawned on the connection's thread, closing it would stop
the template and its children (which watch the template's pid) while the worker lives
on."""

from __future__ import annotations

import time

from corral.rpc.client import RPCClient
from tests.integration.test_fork_template import SECRET, _parent_of, _worker


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_closing_the_connection_that_asked_for_the_first_fork_stops_no_child(tmp_path):
    with _worker(tmp_path) as (worker_pid, address):
        client = RPCClient(SECRET)
        child = client.request(
            address,
            "/fork",
            {"role": "a", "index": 0, "module": None, "env": {}, "timeout": 60},
            timeout=90,
        )["pid"]
        template = _parent_of(child)
        assert template != worker_pid  # made by the template
        client.close()  # the worker's thread for that connection ends
        # not a timing assertion: the signal comes at once when the thread ends; give it
        # (and the child's own SIGTERM handling) a few seconds on a loaded machine
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _alive(template) and _alive(child):
            time.sleep(0.1)
        assert _alive(worker_pid)
        assert _alive(template), "the fork template stopped when a connection closed"
        assert _alive(child), "a forked child stopped when a connection closed"
