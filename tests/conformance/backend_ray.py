"""The Ray backend under test: ONE real Ray runtime for the whole session.

Two Ray nodes on this machine (``ray.cluster_utils.Cluster``), each with 8 CPUs and 8
declared GPUs (no physical GPU is needed: Ray only counts them). The nodes also declare
an accelerator type each (``NODE_ACCELERATORS``, a Ray node resource) and the head a
custom resource (``CUSTOM_RESOURCE``), for the heterogeneous-resource tests. Conformance tests and
``tests/ray`` share it through ``ray_cluster``; it is shut down when the last user is done.
"""

from __future__ import annotations

import contextlib
import threading

import pytest

from tests.conformance.harness import BackendUnderTest, require_service

NODES = 2
CPUS_PER_NODE = 8
GPUS_PER_NODE = 8
NODE_ACCELERATORS = ("FAKE_A100", "FAKE_H100")
"""Declared accelerator types of node 0 (head) and node 1 (no such hardware exists)."""
CUSTOM_RESOURCE = ("rollout_slot", 4)
"""A custom resource only the head node declares, and how much of it."""
OBJECT_STORE = 128 * 1024**2

_lock = threading.Lock()
_state: dict = {"users": 0, "cluster": None}


class RayTestCluster:
    def __init__(self, cluster, ray):
        self.cluster = cluster
        self.ray = ray
        self.address = cluster.address

    def leftovers(self, experiment: str, trial: str) -> list[str]:
        """Live actors and placement groups named for this trial."""
        from ray.util.placement_group import placement_group_table

        from corral.backends.ray.state import name_prefix

        prefix = name_prefix(experiment, trial) + ":"
        left = [
            f"placement group {v['name']} ({v['state']})"
            for v in placement_group_table().values()
            if (v.get("name") or "").startswith(prefix) and v.get("state") != "REMOVED"
        ]
        left += [
            f"actor {a['name']}"
            for a in self.ray.util.list_named_actors(all_namespaces=True)
            if a["name"].startswith(prefix)
        ]
        # the GCS actor table (what ray.util.state reads, without needing the dashboard)
        from ray._private import state

        left += [
            f"actor {a.get('Name')} ({a.get('State')}) in the GCS actor table"
            for a in state.actors().values()
            if (a.get("Name") or "").startswith(prefix) and a.get("State") != "DEAD"
        ]
        return sorted(set(left))

    def nodes(self) -> list[str]:
        return [n["NodeID"] for n in self.ray.nodes() if n["Alive"]]

    def wait_idle(self, timeout: float = 10.0) -> None:
        """Until every CPU and GPU is free again (removed groups return resources lazily)."""
        import time

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            total, free = self.ray.cluster_resources(), self.ray.available_resources()
            if all(free.get(k, 0) >= total.get(k, 0) for k in ("CPU", "GPU")):
                return
            time.sleep(0.05)


def acquire_cluster() -> RayTestCluster:
    with _lock:
        if _state["cluster"] is None:
            try:
                from corral.backends.ray.runtime import apply_quiet_env

                apply_quiet_env()
                import ray
                from ray.cluster_utils import Cluster
            except ImportError as exc:
                require_service("ray", f"cannot import ray: {exc}")
            if ray.is_initialized():
                ray.shutdown()
            try:
                cluster = Cluster(
                    initialize_head=True,
                    head_node_args={
                        "num_cpus": CPUS_PER_NODE,
                        "num_gpus": GPUS_PER_NODE,
                        "resources": {
                            f"accelerator_type:{NODE_ACCELERATORS[0]}": 1,
                            CUSTOM_RESOURCE[0]: CUSTOM_RESOURCE[1],
                        },
                        "include_dashboard": False,
                        "object_store_memory": OBJECT_STORE,
                    },
                )
                for i in range(1, NODES):
                    cluster.add_node(
                        num_cpus=CPUS_PER_NODE,
                        num_gpus=GPUS_PER_NODE,
                        resources={f"accelerator_type:{NODE_ACCELERATORS[i % 2]}": 1},
                        object_store_memory=OBJECT_STORE,
                    )
                cluster.wait_for_nodes()
                ray.init(address=cluster.address, log_to_driver=False)
            except Exception as exc:
                require_service("ray", f"cannot start a Ray cluster: {exc}")
            _state["cluster"] = RayTestCluster(cluster, ray)
        _state["users"] += 1
        return _state["cluster"]


def release_cluster() -> None:
    with _lock:
        _state["users"] -= 1
        if _state["users"] > 0 or _state["cluster"] is None:
            return
        test_cluster = _state["cluster"]
        _state["cluster"] = None
    test_cluster.ray.shutdown()
    test_cluster.cluster.shutdown()


class RayNodeDrain:
    """A spot node reclaimed: the role's workers run on an extra node (the session's nodes
    are full of another trial's workers); Ray drains that node for preemption (what its
    autoscaler and ``ray drain-node --reason DRAIN_NODE_REASON_PREEMPTION`` do), then the
    node goes; giving back adds a new node."""

    heard = "Ray is draining node"

    def __init__(self, test_cluster: RayTestCluster, hog) -> None:
        self.test_cluster = test_cluster
        self.hog = hog
        self.added: list = []

    def add_node(self) -> None:
        self.added.append(self.test_cluster.cluster.add_node(num_cpus=2, num_gpus=GPUS_PER_NODE))
        self.test_cluster.cluster.wait_for_nodes()

    def job(self, role: str, replicas: int, **spec):
        from corral import Job, SchedulingSpec

        return Job(role=role, replicas=replicas, tasks=[SchedulingSpec(cpu=1, gpu=1, **spec)])

    def warn(self, sched, role: str) -> None:
        import time

        import ray
        from ray.core.generated import autoscaler_pb2

        node_id = self.added[-1].node_id
        for index in range(len(sched.get_workers(role))):
            assert sched.launcher.placement(role, index)["node_id"] == node_id
        gcs = ray._private.worker.global_worker.gcs_client
        accepted, why = gcs.drain_node(
            node_id,
            autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"),
            "corral test: spot instance reclaimed",
            int((time.time() + 60) * 1000),
        )
        assert accepted, why

    def take(self, sched, role: str) -> None:
        self.test_cluster.cluster.remove_node(self.added.pop())

    def give_back(self, sched, role: str) -> None:
        self.add_node()

    def check_back(self, sched, role: str) -> None:
        """Ray places the same bundles again: nothing else to check."""

    def close(self) -> None:
        try:
            self.hog.close()
        finally:
            for node in self.added:
                self.test_cluster.cluster.remove_node(node)
            self.test_cluster.cluster.wait_for_nodes()


@pytest.fixture(scope="session")
def ray_cluster():
    cluster = acquire_cluster()
    yield cluster
    release_cluster()


@pytest.fixture(scope="session")
def ray_backend(ray_cluster, tmp_path_factory) -> BackendUnderTest:
    from corral.backends.ray.scheduler import RayScheduler

    root = str(tmp_path_factory.mktemp("corral-ray"))

    def make(cfg, **kwargs):
        kwargs.setdefault("startup_timeout", 60)
        return RayScheduler(exp_config=cfg, fileroot=root, **kwargs)

    @contextlib.contextmanager
    def preemption():
        hog = backend.scheduler()
        drain = RayNodeDrain(ray_cluster, hog)
        try:
            from corral import Job, SchedulingSpec

            # the session's nodes are full: the preempted role can only use the extra node
            hog.create_workers(
                Job(role="hog", replicas=NODES, tasks=[SchedulingSpec(cpu=1, gpu=GPUS_PER_NODE)])
            )
            drain.add_node()
            yield drain
        finally:
            drain.close()

    backend = BackendUnderTest(
        name="ray",
        make=make,
        gpus_per_node=GPUS_PER_NODE,
        nodes=NODES,
        fileroot=root,
        # a controller in another process (the controller-death test) joins this cluster
        controller_env={"RAY_ADDRESS": ray_cluster.address},
        leftovers=ray_cluster.leftovers,
        preemption=preemption,
    )
    return backend
