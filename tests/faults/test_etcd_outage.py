"""Name-resolve (etcd) goes away while workers run, then comes back."""

from __future__ import annotations

import asyncio

import pytest

from corral import BaseExperimentConfig, Job, LocalScheduler
from corral.errors import NameResolveError
from tests.unit.test_name_resolve_contract import LocalEtcd

pytestmark = pytest.mark.etcd
ECHO = "corral.testing.engines.EchoEngine"


def test_calls_survive_an_etcd_outage_and_lookups_recover(tmp_path):
    etcd = LocalEtcd(tmp_path / "etcd")
    address = etcd.start()
    cfg = BaseExperimentConfig(experiment_name="outage", trial_name="t1")
    cfg.cluster.name_resolve.type = "etcd3"
    cfg.cluster.name_resolve.etcd3_addr = address
    sched = LocalScheduler(cfg, fileroot=str(tmp_path / "root"), gpu_devices=[])
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
