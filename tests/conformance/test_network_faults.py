"""Connections cut mid-transfer, and name-resolve (etcd) going away while workers run."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from corral import Job
from corral.errors import NameResolveError, WorkerConnectionError
from tests.integration.test_name_resolve_contract import LocalEtcd
from tests.support.proxy import CuttingProxy, sockets_only

ECHO = "corral.testing.engines.EchoEngine"


def test_cut_mid_transfer_gives_a_clear_error_and_the_next_call_works(sched):
    (wid,) = sched.create_workers(Job(role="net", replicas=1))
    asyncio.run(sched.create_engine(wid, ECHO, "e"))
    worker = sched.get_workers("net")[0]
    proxy = CuttingProxy((worker.ip, worker.port), cut_after=8 << 20)
    try:
        worker.ip, worker.port = "127.0.0.1", proxy.port
        sockets_only(sched, worker.address)
        payload = np.arange(16 << 20, dtype=np.float32)
        with pytest.raises(WorkerConnectionError, match="net/0"):
            sched.call_engine(wid, "echo", "e", payload, rpc_meta={"max_retries": 0})
        assert np.array_equal(sched.call_engine(wid, "echo", "e", payload), payload)
        assert proxy.connections >= 2
    finally:
        proxy.close()


@pytest.mark.etcd
def test_calls_survive_an_etcd_outage_and_lookups_recover(backend, tmp_path):
    etcd = LocalEtcd(tmp_path / "etcd")
    address = etcd.start()
    sched = backend.scheduler(name_resolve={"type": "etcd3", "etcd3_addr": address})
    try:
        (wid,) = sched.create_workers(Job(role="steady", replicas=1))
        asyncio.run(sched.create_engine(wid, ECHO, "e"))
        etcd.stop()
        for i in range(20):
            assert sched.call_engine(wid, "echo", "e", i) == i
        with pytest.raises(NameResolveError, match=address):
            sched.create_workers(Job(role="newcomer", replicas=1))
        assert sched.roles == ["steady"]
        etcd.start()
        assert sched.call_engine(wid, "echo", "e", "still here") == "still here"
        assert sched.create_workers(Job(role="newcomer", replicas=1)) == ["newcomer/0"]
        assert sched.health("newcomer/0")["status"] == "ok"
    finally:
        sched.close()
        etcd.stop()
