"""Connections cut mid-transfer, stale addresses, and the opt-in restart policy (local)."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from corral import (
    BaseExperimentConfig,
    ConfigError,
    Job,
    LocalScheduler,
    SchedulingSpec,
)
from corral.errors import WorkerConnectionError
from corral.rpc.async_client import AsyncRPCClient
from corral.rpc.client import RPCClient, WorkerUnreachableError
from tests.support.proxy import CuttingProxy, sockets_only

ECHO = "corral.testing.engines.EchoEngine"


@pytest.fixture
def local_sched(tmp_path):
    cfg = BaseExperimentConfig(experiment_name="faults", trial_name=tmp_path.name[:40])
    s = LocalScheduler(exp_config=cfg, fileroot=str(tmp_path), gpu_devices=[])
    yield s
    s.close()


def _through_proxy(local_sched, wid: str, proxy: CuttingProxy) -> None:
    worker = local_sched.get_workers(wid.split("/")[0])[int(wid.split("/")[1])]
    worker.ip, worker.port = "127.0.0.1", proxy.port
    sockets_only(local_sched, worker.address)


def test_retry_after_a_cut_request_runs_the_method_once(local_sched):
    """The request is cut twice before the worker has read it all: the third attempt runs
    it, and only that one did (a cut request never reaches the engine)."""
    (wid,) = local_sched.create_workers(Job(role="once", replicas=1))
    asyncio.run(local_sched.create_engine(wid, ECHO, "e"))
    w = local_sched.get_workers("once")[0]
    big = np.ones(4 << 20, dtype=np.float32)
    proxy = CuttingProxy((w.ip, w.port), cut_after=1 << 20, cuts=2)
    try:
        _through_proxy(local_sched, wid, proxy)
        assert np.array_equal(
            local_sched.call_engine(wid, "echo", "e", big, rpc_meta={"max_retries": 3}), big
        )
        assert proxy.cut == 2
        assert local_sched.call_engine(wid, "count", "e") == 1
    finally:
        proxy.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_max_retries_counts_attempts(local_sched, monkeypatch, mode):
    """AReaL's ``max_retries=N`` is the number of attempts, not of retries after the first:
    with every request cut before the worker has it all, the call is sent N times, then
    fails naming the worker and the count; ``retry_delay`` is waited before each retry,
    doubling. (Counted where the scheduler hands the call to
    the RPC client: the sync client's own redial of a pooled connection is not an attempt.
    The health probes between attempts are small and pass the proxy.)"""
    (wid,) = local_sched.create_workers(Job(role="tries", replicas=1))
    asyncio.run(local_sched.create_engine(wid, ECHO, "e"))
    w = local_sched.get_workers("tries")[0]
    sent: list[str] = []
    client_class = RPCClient if mode == "sync" else AsyncRPCClient
    entry = "request" if mode == "sync" else "start"  # where Caller hands each attempt over
    real = getattr(client_class, entry)

    def counted(self, address, path, *args, **kwargs):
        if path == "/call":
            sent.append(kwargs.get("request_id"))
        return real(self, address, path, *args, **kwargs)

    monkeypatch.setattr(client_class, entry, counted)
    delay, waits = 0.0123, []  # retry_delay: waited before each retry, doubling
    real_sleep = time.sleep if mode == "sync" else asyncio.sleep

    def sleep(seconds, *args):
        if seconds in (delay, 2 * delay):
            waits.append(seconds)
        return real_sleep(seconds, *args)

    monkeypatch.setattr(time if mode == "sync" else asyncio, "sleep", sleep)
    big = np.ones(4 << 20, dtype=np.float32)
    proxy = CuttingProxy((w.ip, w.port), cut_after=1 << 20, cuts=1000)
    try:
        _through_proxy(local_sched, wid, proxy)
        with pytest.raises(WorkerConnectionError, match="tries/0") as info:
            if mode == "sync":
                local_sched.call_engine(wid, "echo", "e", big, max_retries=3, retry_delay=delay)
            else:
                asyncio.run(
                    local_sched.async_call_engine(
                        wid, "echo", "e", big, max_retries=3, retry_delay=delay
                    )
                )
        assert len(sent) == 3, f"{len(sent)} attempts for max_retries=3"
        assert waits == [delay, 2 * delay]  # before the second and the third
        assert len(set(sent)) == 1  # one request id: the attempts are one call
        assert "broke 3 time(s)" in str(info.value)
        assert proxy.cut >= 3  # every attempt was cut on the wire
    finally:
        proxy.close()


@pytest.mark.parametrize("reply_bytes", [64, 16 << 20], ids=["small-reply", "large-reply"])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_retry_after_a_cut_reply_runs_the_method_once(local_sched, mode, reply_bytes):
    """The worker ran the call, then its reply was cut on the way back: the retry must
    carry the same request id so the worker answers from its result cache instead of
    running the method a second time."""
    (wid,) = local_sched.create_workers(Job(role="replycut", replicas=1))
    asyncio.run(local_sched.create_engine(wid, ECHO, "e"))
    w = local_sched.get_workers("replycut")[0]
    value = np.arange(reply_bytes // 4, dtype=np.float32)
    # cut inside the reply's body (its head is ~100 bytes, the frame prefix follows)
    proxy = CuttingProxy((w.ip, w.port), cut_after=120, cuts=1, direction="reply")
    try:
        _through_proxy(local_sched, wid, proxy)
        meta = {"max_retries": 2}
        if mode == "sync":
            got = local_sched.call_engine(wid, "echo", "e", value, rpc_meta=meta)
        else:
            got = asyncio.run(local_sched.async_call_engine(wid, "echo", "e", value, rpc_meta=meta))
        assert np.array_equal(got, value)
        assert proxy.cut == 1, "the proxy did not cut the reply"
        assert local_sched.call_engine(wid, "count", "e") == 1, "the retry ran the method again"
    finally:
        proxy.close()


def test_a_stale_address_is_refused_by_the_worker_now_there(local_sched):
    a, b = local_sched.create_workers(Job(role="pair", replicas=2))
    wa, wb = local_sched.get_workers("pair")
    from corral.rpc.client import RPCClient

    client = RPCClient(local_sched.secret)
    with pytest.raises(WorkerUnreachableError, match="stale"):
        client.request(wb.address, "/health", method="GET", timeout=5, identity=wa.identity)
    assert (
        client.request(wa.address, "/health", method="GET", timeout=5, identity=wa.identity)[
            "worker_id"
        ]
        == a
    )


def test_negative_restarts_are_refused():
    with pytest.raises(ConfigError, match="max_restarts"):
        SchedulingSpec(max_restarts=-1)


@pytest.mark.parametrize("transport", ["shared-memory", "socket"])
def test_a_delivered_large_reply_is_not_kept_and_its_duplicate_never_runs(
    local_sched, monkeypatch, transport
):
    """Delivery is proven by the client's ACK of a shared-memory reply, or (over a
    socket: another host, or CORRAL_SHM=0) by its next request on the same connection."""
    if transport == "socket":
        monkeypatch.setenv("CORRAL_SHM", "0")  # the worker inherits it: no segments
    from corral.errors import ProtocolError
    from corral.rpc.client import RPCClient

    (wid,) = local_sched.create_workers(Job(role="big", replicas=1))
    asyncio.run(local_sched.create_engine(wid, ECHO, "e"))
    worker = local_sched.get_workers("big")[0]
    client = RPCClient(local_sched.secret)
    payload = {"engine_name": "e", "method": "echo", "args": [np.ones(1 << 20, np.float32)]}
    client.request(worker.address, "/call", payload, request_id="rid-big", timeout=30)
    # the next request on the same connection proves the first reply was delivered
    assert client.request(worker.address, "/call", {"engine_name": "e", "method": "count"}) == 1
    with pytest.raises(ProtocolError, match="delivered already"):
        client.request(worker.address, "/call", payload, request_id="rid-big", timeout=30)
    assert client.request(worker.address, "/call", {"engine_name": "e", "method": "count"}) == 1
    client.close()
