"""RayScheduler on a real two-node Ray cluster (2 x 8 declared GPUs, see backend_ray.py)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import uuid

import pytest

from corral import (
    BaseExperimentConfig,
    ConfigError,
    Job,
    SchedulingSpec,
    WorkerCreationError,
    WorkerFailedError,
    WorkerTimeoutError,
)
from tests.conformance.backend_ray import GPUS_PER_NODE, ray_cluster  # noqa: F401
from tests.conformance.harness import pid_alive

pytestmark = pytest.mark.ray

ECHO = "corral.testing.engines.EchoEngine"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def make(ray_cluster, tmp_path):  # noqa: F811
    """A RayScheduler factory for a fresh trial; checks nothing of it is left afterwards."""
    from corral.backends.ray.scheduler import RayScheduler

    made = []

    def factory(**kwargs):
        cfg = BaseExperimentConfig(experiment_name="ray-test", trial_name=uuid.uuid4().hex[:8])
        cfg.cluster.n_gpus_per_node = GPUS_PER_NODE
        kwargs.setdefault("startup_timeout", 60)
        sched = RayScheduler(exp_config=cfg, fileroot=str(tmp_path), **kwargs)
        made.append(sched)
        return sched

    ray_cluster.wait_idle()
    yield factory
    for sched in made:
        sched.close()
        assert ray_cluster.leftovers(sched.experiment_name, sched.trial_name) == []
    import ray

    assert ray.is_initialized(), "a scheduler shut down a runtime it did not start"


def gpu_job(role, replicas, gpu=1, strategy="separate", **kw):
    spec = SchedulingSpec(cpu=1, gpu=gpu, ray_placement_strategy=strategy, **kw)
    return Job(role=role, replicas=replicas, tasks=[spec])


def test_separate_spreads_over_nodes_and_shared_packs_on_one(make, ray_cluster):  # noqa: F811
    sched = make()
    assert len(ray_cluster.nodes()) == 2
    sched.create_workers(gpu_job("spread", 2))
    nodes = {sched.launcher.placement("spread", i)["node_id"] for i in range(2)}
    groups = {sched.launcher.placement("spread", i)["pg_id"] for i in range(2)}
    assert len(nodes) == 2, "separate: one worker per node when both have room"
    assert len(groups) == 2, "separate: one placement group per worker"
    sched.delete_workers("spread")
    ray_cluster.wait_idle()

    sched.create_workers(gpu_job("packed", 2, strategy="shared"))
    where = [sched.launcher.placement("packed", i) for i in range(2)]
    assert len({w["node_id"] for w in where}) == 1, "shared: PACK puts both on one node"
    assert len({w["pg_id"] for w in where}) == 1, "shared: one group for the role"
    assert [w["bundle_index"] for w in where] == [0, 1]


def test_sigkill_of_an_actor_mid_call_gives_worker_failed_naming_the_ray_actor(make):
    """(How fast: benchmarks/faults.py; tests assert no timings.)"""
    sched = make()
    (wid,) = sched.create_workers(Job(role="victim", replicas=1))
    asyncio.run(sched.create_engine(wid, ECHO, "e"))
    worker = sched.get_workers("victim")[0]

    def kill():
        os.kill(worker.pid, signal.SIGKILL)

    timer = threading.Timer(0.5, kill)
    timer.start()
    with pytest.raises(WorkerFailedError) as info:
        sched.call_engine(wid, "sleep", "e", 60, rpc_meta={"timeout": 50})
    timer.join()
    # the death itself on every backend: tests/conformance/test_failures.py
    assert "Ray actor" in info.value.reason


def test_unsatisfiable_request_names_what_was_asked_and_leaves_no_group(make, ray_cluster):  # noqa: F811
    sched = make(startup_timeout=3)
    with pytest.raises(WorkerCreationError) as info:
        sched.create_workers(gpu_job("huge", 6, gpu=3))
    text = str(info.value)
    assert "GPU 3" in text and "GPU 18" in text, text  # per worker, and the role in total
    assert f"GPU {2 * GPUS_PER_NODE}" in text and "available" in text, text  # the cluster
    assert sched.roles == []
    assert ray_cluster.leftovers(sched.experiment_name, sched.trial_name) == []


def test_deferred_groups_time_out_with_the_pending_request(make, ray_cluster):  # noqa: F811
    make().create_workers(gpu_job("hog", 1, gpu=GPUS_PER_NODE))  # fits in total, not now
    sched = make(startup_timeout=3)
    with pytest.raises(WorkerTimeoutError, match="placement group") as info:
        sched.create_workers(gpu_job("later", 2, gpu=GPUS_PER_NODE, strategy="deferred"))
    assert "GPU" in str(info.value)
    assert ray_cluster.leftovers(sched.experiment_name, sched.trial_name) == []


def test_gpu_request_on_a_cluster_without_accelerators_is_refused_early(make):
    sched = make()
    sched.launcher.accelerator_kind = lambda: None
    with pytest.raises(ConfigError, match=r"job.tasks\[0\].gpu=1.*no GPU or NPU"):
        sched.create_workers(gpu_job("nogpu", 1))
    with pytest.raises(ConfigError, match="cmd"):
        sched.create_workers(Job(role="cmd", replicas=1, tasks=[SchedulingSpec(cmd="true")]))
    assert sched.roles == []


@pytest.mark.parametrize("strategy", ["separate", "shared"])
def test_fork_lands_on_the_same_node_group_and_bundle(make, strategy):
    sched = make()
    sched.create_workers(gpu_job("rollout", 2, strategy=strategy))
    sched.fork_workers("proxy", "rollout")
    for i in range(2):
        parent = sched.launcher.placement("rollout", i)
        child = sched.launcher.placement("proxy", i)
        assert child["node_id"] == parent["node_id"]
        assert child["pg_id"] == parent["pg_id"]
        assert child["bundle_index"] == parent["bundle_index"]
        assert child["visible_devices"] == parent["visible_devices"]
        assert child["pid"] != parent["pid"]
    assert [w.forked for w in sched.get_workers("proxy")] == [True, True]


def test_fork_of_a_multi_gpu_worker_sees_all_its_gpus(make):
    sched = make()
    (wid,) = sched.create_workers(gpu_job("big", 1, gpu=2))
    (child,) = sched.fork_workers("helper", "big")
    for w in (wid, child):
        asyncio.run(sched.create_engine(w, ECHO, "e"))
    parent_devices = sched.call_engine(wid, "getenv", "e", "CUDA_VISIBLE_DEVICES")
    assert len(parent_devices.split(",")) == 2
    assert sched.call_engine(child, "getenv", "e", "CUDA_VISIBLE_DEVICES") == parent_devices


def test_master_address_is_on_rank_zeros_node(make):
    sched = make()
    ids = sched.create_workers(Job(role="trainer", replicas=2))
    asyncio.run(sched.create_engine(ids[0], ECHO, "e"))
    addr = sched.call_engine(ids[0], "getenv", "e", "MASTER_ADDR")
    port = int(sched.call_engine(ids[0], "getenv", "e", "MASTER_PORT"))
    assert addr == sched.launcher.placement("trainer", 0)["node_ip"] and port > 0


def test_nothing_is_left_after_teardown(make, ray_cluster):  # noqa: F811
    import ray

    sched = make()
    sched.create_workers(gpu_job("a", 3))
    sched.create_workers(gpu_job("b", 2, strategy="shared"))
    sched.fork_workers("a-helper", "a")
    pids = [w.pid for r in sched.roles for w in sched.get_workers(r)]
    assert ray_cluster.leftovers(sched.experiment_name, sched.trial_name)
    sched.delete_workers()
    assert ray_cluster.leftovers(sched.experiment_name, sched.trial_name) == []
    assert [p for p in pids if pid_alive(p)] == []
    assert ray.available_resources().get("GPU") == ray.cluster_resources().get("GPU")


def _run(code_or_file, env_extra, timeout=240):
    # this tree's corral first (not another checkout installed in the environment)
    path = os.pathsep.join([os.path.join(ROOT, "src"), ROOT])
    env = dict(os.environ, RAY_ADDRESS="local", PYTHONPATH=path, **env_extra)
    argv = [sys.executable, *(["-c", code_or_file] if "\n" in code_or_file else [code_or_file])]
    return subprocess.run(
        argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )


def test_spec_example_runs(tmp_path):
    proc = _run(os.path.join(ROOT, "examples", "ray_minimal.py"), {})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Ray workers: ['rollout/0', 'rollout/1']" in proc.stdout


def test_scheduler_starts_its_own_runtime_and_shuts_it_down(tmp_path):
    code = f"""
import sys
from corral import BaseExperimentConfig, Job
assert "ray" not in sys.modules, "import corral imported ray"
from corral.backends.ray.scheduler import RayScheduler
assert "ray" not in sys.modules, "importing the backend imported ray"
import ray
sched = RayScheduler(exp_config=BaseExperimentConfig(trial_name="own"), fileroot={str(tmp_path)!r},
                     init_kwargs={{"num_cpus": 2}})
assert sched.launcher.started_runtime and ray.is_initialized()
assert sched.create_workers(Job(role="w", replicas=1)) == ["w/0"]
assert sched.health("w/0")["status"] == "ok"
sched.close()
assert not ray.is_initialized(), "close() kept the runtime it started"
print("OWN-RUNTIME-OK")
"""
    proc = _run(code, {})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "OWN-RUNTIME-OK" in proc.stdout


def test_max_restarts_brings_a_killed_worker_back_on_its_bundle(make):
    sched = make()
    job = Job(role="phoenix", replicas=1, tasks=[SchedulingSpec(gpu=1, max_restarts=1)])
    (wid,) = sched.create_workers(job)
    before = sched.launcher.placement("phoenix", 0)
    os.kill(before["pid"], signal.SIGKILL)
    with pytest.raises(WorkerFailedError) as info:
        sched.call_engine(wid, "noop", "missing")
    assert getattr(info.value, "restarted", False), str(info.value)
    after = sched.launcher.placement("phoenix", 0)
    assert after["pid"] != before["pid"]
    assert (after["pg_id"], after["node_id"]) == (before["pg_id"], before["node_id"])
    assert sched.health(wid)["status"] == "ok"


def test_a_worker_that_asks_for_nothing_still_gets_a_bundle(make):
    sched = make()
    (wid,) = sched.create_workers(Job(role="tiny", replicas=1, tasks=[SchedulingSpec(cpu=0)]))
    assert sched.health(wid)["status"] == "ok"
    assert sched.launcher.placement("tiny", 0)["bundle_index"] == 0


def test_actors_get_their_environment_without_a_runtime_env(make):
    """Workers reuse Ray's started worker processes: no per-actor runtime_env. The worker
    environment still arrives (thread counts from cpu=, also for torch imported later), and
    the trial secret is neither in the process's environment nor in its exec environment."""
    sched = make()
    ids = sched.create_workers(
        Job(role="envy", replicas=2, tasks=[SchedulingSpec(cpu=2, env_vars={"MY_FLAG": "on"})])
    )
    asyncio.run(sched.create_engine(ids[0], ECHO))
    env = sched.call_engine(ids[0], "ray_runtime_env")
    assert not env.get("env_vars"), f"actor has a runtime_env of its own: {env}"
    assert sched.call_engine(ids[0], "getenv", None, "MY_FLAG") == "on"
    assert sched.call_engine(ids[0], "getenv", None, "OMP_NUM_THREADS") == "2"
    assert sched.call_engine(ids[0], "getenv", None, "CORRAL_ROLE") == "envy"
    assert sched.call_engine(ids[0], "getenv", None, "CORRAL_SECRET") is None
    assert sched.call_engine(ids[0], "torch_threads") == 2
    pid = sched.launcher.placement("envy", 0)["pid"]
    with open(f"/proc/{pid}/environ", "rb") as fh:
        assert sched.secret.encode() not in fh.read()


def test_spec_training_script_example_runs_on_ray(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "examples/training_script.py",
            "scheduler.type=ray",
            f"cluster.fileroot={tmp_path}",
        ],
        env={**os.environ, "RAY_ADDRESS": "local"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "'completion': 'computing quantum Explain'" in proc.stdout


def test_the_backend_package_named_ray_does_not_shadow_the_ray_library():
    import corral.backends.ray as package
    from corral.backends.ray.runtime import import_ray

    library = import_ray()  # what every module of the package gets for ``import ray``
    assert library is not package and callable(library.remote) and callable(library.init)
    assert os.path.join("corral", "backends") not in library.__file__
