"""``cluster.name_resolve.type="ray"``: the name-resolve contract on the GCS key-value
store of a real Ray cluster (the same tests as tests/integration/test_name_resolve_contract.py),
and AReaL's keyword ``name_resolve_type="ray"`` (issue 24, defect 3). Forged records are
refused like those of the file and etcd stores: tests/security/test_discovery_hijack.py."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest

from corral import Job
from corral.discovery.ray_kv import RayNameResolve
from tests.conformance.backend_ray import ray_cluster  # noqa: F401
from tests.integration.test_name_resolve_contract import (  # noqa: F401  (collected here for Ray)
    P,
    store,
    test_add_then_get,
    test_bad_keys_are_refused,
    test_clear_subtree,
    test_delete,
    test_describe_rebuilds_a_view_of_the_same_store,
    test_get_subtree_returns_only_keys_below_prefix,
    test_replace_overwrites,
    test_second_add_is_refused,
    test_wait_refuses_bad_keys,
    test_wait_returns_existing_value,
    test_wait_returns_once_another_thread_adds,
    test_wait_times_out,
)

pytestmark = pytest.mark.ray


@pytest.fixture
def make_store(ray_cluster) -> Iterator[Callable[[], RayNameResolve]]:  # noqa: F811
    """Views of the session cluster's store (each its own GCS client, as two processes)."""
    built: list[RayNameResolve] = []

    def make() -> RayNameResolve:
        built.append(RayNameResolve(ray_cluster.address))
        return built[-1]

    make().clear_subtree(P)
    yield make
    for one in built:
        one.clear_subtree(P)
        one.close()


def test_the_address_is_the_joined_runtimes_and_a_worker_needs_no_ray_init(ray_cluster, tmp_path):  # noqa: F811
    """In a process that joined Ray the store needs no address; another process (a worker)
    reaches the same records with the address from ``describe()`` alone."""
    from corral.backends.local import LocalScheduler

    here = RayNameResolve()
    here.add(f"{P}/from-controller", "yes", replace=True)
    desc = here.describe()
    assert desc["type"] == "ray" and desc["address"]
    other = subprocess.run(
        [
            sys.executable, "-c",
            "import sys, json, ray; from corral.discovery import make_name_resolve; "
            "s = make_name_resolve(json.loads(sys.argv[1])); "
            f"print(s.get('{P}/from-controller'), ray.is_initialized())",
            json.dumps(desc),
        ],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert other.returncode == 0, other.stderr
    assert other.stdout.split() == ["yes", "False"]
    here.clear_subtree(P)

    sched = LocalScheduler(
        gpu_devices=[],
        fileroot=str(tmp_path),
        experiment_name="raynr",
        trial_name="kw",
        name_resolve_type="ray",  # AReaL's keyword
    )
    try:
        assert sched.name_resolve.describe() == {"type": "ray", "address": desc["address"]}
        (wid,) = sched.create_workers(Job(role="w", replicas=1))
        assert sched.health(wid)["status"] == "ok"  # the worker registered in Ray's GCS
    finally:
        sched.close()
