"""Slowloris against every HTTP surface, as another local user (issue 25, attacks 1 and 3).

Before: the Prometheus endpoint and the dashboard were ``ThreadingHTTPServer`` (a thread
per connection, a timeout per read), so 1,100 connections that each sent a header line
every few seconds took a controller to 1,019 threads and 1,024 descriptors; its lease
renewal then failed and the trial's worker exited. The worker's own server held a thread
per waiting connection. Now every surface keeps waiting connections in a gate, without a
thread, for at most 10 s each, capped per peer and in total.

Each test floods one surface with ``CORRAL_SEC_FLOOD`` trickling connections (600 by
default; 2000 in the measured run of docs/security.md) from ``corral-mallory`` and
checks that the owner's authenticated requests, each on a new connection, all succeed,
and that the process serving the surface gains no thread per connection and only a
bounded number of descriptors. The owner's latency percentiles are printed (``-s``).
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import time
import uuid

import psutil

import corral
from corral import Job
from corral.observe.dashboard import MAX_STREAMS, MAX_WAITING, Dashboard
from corral.observe.prometheus import MAX_HANDLERS
from corral.observe.prometheus import MAX_WAITING as METRICS_WAITING
from corral.observe.source import TrialSource
from corral.rpc.client import RPCClient
from corral.rpc.server import MAX_UNAUTHENTICATED
from tests.security.flood import CONNECTIONS, Flood, owner_requests, sample_while

ATTACK_SECONDS = 30.0
WARMUP = 5.0  # the flood builds up before the owner's requests are timed


def _report(surface: str, owner: dict, attack: dict, **peaks: int) -> None:
    print(f"\n[flood] {surface}: {CONNECTIONS} trickling connections {attack}; owner {owner}; "
          f"peaks {peaks}")  # fmt: skip


def test_worker_server_serves_its_controller_through_a_trickle_flood(local_backend) -> None:
    sched = local_backend.scheduler()
    try:
        (wid,) = sched.create_workers(Job(role="srv", replicas=1))
        worker = sched.get_workers("srv")[0]
        proc = psutil.Process(worker.pid)
        threads_before, fds_before = proc.num_threads(), proc.num_fds()
        flood = Flood(worker.port, "/health", ATTACK_SECONDS)
        peak_threads = sample_while(ATTACK_SECONDS, proc.num_threads)
        peak_fds = sample_while(ATTACK_SECONDS, proc.num_fds)
        time.sleep(WARMUP)

        def fresh_connection_health() -> bool:
            client = RPCClient(sched.secret)
            try:
                reply = client.request(worker.address, "/health", method="GET", timeout=20)
                return reply["status"] == "ok"
            finally:
                client.close()

        owner = owner_requests(fresh_connection_health, ATTACK_SECONDS - WARMUP - 3)
        attack = flood.result()
        threads, fds = peak_threads(), peak_fds()
        _report("worker", owner, attack, threads=threads - threads_before, fds=fds - fds_before)
        assert attack["opened"] >= CONNECTIONS, attack  # the attack really ran
        assert owner["requests"] > 10 and not owner["failures"], owner
        # no thread per waiting connection (a few for the owner's own connections)
        assert threads <= threads_before + 6, (threads, threads_before)
        assert fds <= fds_before + MAX_UNAUTHENTICATED + 16, (fds, fds_before)
        assert sched.health(wid)["status"] == "ok"
    finally:
        sched.close()


def test_dashboard_serves_its_owner_through_a_trickle_flood(local_backend) -> None:
    dash = Dashboard(TrialSource(local_backend.fileroot, max_age=600), port=0).serve_in_thread()
    me = psutil.Process()
    try:
        threads_before, fds_before = me.num_threads(), me.num_fds()
        flood = Flood(dash.port, "/api/trials", ATTACK_SECONDS)
        peak_threads = sample_while(ATTACK_SECONDS, me.num_threads)
        peak_fds = sample_while(ATTACK_SECONDS, me.num_fds)
        time.sleep(WARMUP)

        def trials() -> bool:
            conn = http.client.HTTPConnection("127.0.0.1", dash.port, timeout=20)
            try:
                conn.request(
                    "GET", "/api/trials", headers={"Authorization": f"Bearer {dash.token}"}
                )
                reply = conn.getresponse()
                return reply.status == 200 and isinstance(json.load(reply), list)
            finally:
                conn.close()

        owner = owner_requests(trials, ATTACK_SECONDS - WARMUP - 3)
        attack = flood.result()
        threads, fds = peak_threads(), peak_fds()
        _report("dashboard", owner, attack, threads=threads - threads_before, fds=fds - fds_before)
        assert attack["opened"] >= CONNECTIONS, attack
        assert owner["requests"] > 10 and not owner["failures"], owner
        # two sampler threads of this test, the owner's handler thread, a little slack
        assert threads <= threads_before + 6, (threads, threads_before)
        assert fds <= fds_before + MAX_WAITING + MAX_STREAMS + 16, (fds, fds_before)
    finally:
        dash.close()


# A controller with the usual ulimit -n 1024 and the Prometheus endpoint on: it prints
# the endpoint, then calls its worker every 0.2 s and samples its own threads and fds.
CONTROLLER = r"""
import json, os, resource, sys, time
resource.setrlimit(resource.RLIMIT_NOFILE, (1024, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
os.environ["CORRAL_METRICS_PORT"] = "0"
from corral import BaseExperimentConfig, Job, make_scheduler
from tests.observe.helpers import wait_stats
fileroot, trial, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
cfg = BaseExperimentConfig(experiment_name="flood", trial_name=trial)
cfg.scheduler.type = "local"
cfg.cluster.fileroot = fileroot
sched = make_scheduler(cfg, gpu_devices=[0])
(wid,) = sched.create_workers(Job(role="w", replicas=1))
snap = wait_stats(sched, lambda s: "metrics_url" in s, what="metrics url")
with open(snap["metrics_token_file"]) as fh:
    token = fh.read()
print(json.dumps({"url": snap["metrics_url"], "token": token}), flush=True)
sys.stdin.readline()  # the attack has started
def threads():
    with open("/proc/self/status") as fh:
        return int(next(l for l in fh if l.startswith("Threads:")).split()[1])
failures, calls, peak_fds, peak_threads = [], 0, 0, 0
end = time.monotonic() + seconds
while time.monotonic() < end:
    try:
        if sched.health(wid)["status"] != "ok":
            failures.append("not ok")
    except Exception as exc:
        failures.append(repr(exc))
    calls += 1
    peak_fds = max(peak_fds, len(os.listdir("/proc/self/fd")))
    peak_threads = max(peak_threads, threads())
    time.sleep(0.2)
held = sched.health(wid)["status"] == "ok"
sched.close()
print(json.dumps({"calls": calls, "failures": failures[:5], "failed": len(failures),
                  "peak_fds": peak_fds, "peak_threads": peak_threads, "ok_after": held}), flush=True)
"""


def test_metrics_flood_costs_the_controller_neither_its_lease_nor_its_fds(tmp_path) -> None:
    """The issue's attack: a controller at ``ulimit -n 1024`` lost its lease, then its
    worker, to 1,100 trickling connections on its Prometheus port."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    src = os.path.dirname(os.path.dirname(corral.__file__))  # the corral under test
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, root])}
    controller = subprocess.Popen(
        [sys.executable, "-c", CONTROLLER, str(tmp_path), f"t{uuid.uuid4().hex[:8]}",
         str(ATTACK_SECONDS - WARMUP)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=root,
    )  # fmt: skip
    try:
        endpoint = json.loads(controller.stdout.readline())
        port = int(endpoint["url"].rsplit(":", 1)[1].split("/")[0])
        flood = Flood(port, "/metrics", ATTACK_SECONDS)
        time.sleep(WARMUP)
        controller.stdin.write("go\n")
        controller.stdin.flush()

        def scrape() -> bool:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
            try:
                conn.request(
                    "GET", "/metrics", headers={"Authorization": f"Bearer {endpoint['token']}"}
                )
                reply = conn.getresponse()
                return reply.status == 200 and b"corral_worker_up" in reply.read()
            finally:
                conn.close()

        owner = owner_requests(scrape, ATTACK_SECONDS - WARMUP - 5)
        attack = flood.result()
        result = json.loads(controller.stdout.readline())
        _report("metrics", owner, attack, controller=result)
        assert attack["opened"] >= CONNECTIONS, attack
        assert owner["requests"] > 10 and not owner["failures"], owner
        # the trial kept its worker and its lease throughout: every call answered
        assert result["failed"] == 0 and result["ok_after"], result
        # the endpoint's budget: its waiting connections and handlers, not the flood's size
        assert result["peak_fds"] <= 64 + METRICS_WAITING + MAX_HANDLERS, result
        assert result["peak_threads"] <= 40, result
    finally:
        if controller.poll() is None:
            controller.kill()
        controller.wait()
