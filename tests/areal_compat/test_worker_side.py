"""What an AReaL user relies on at the worker: rebuilt types, the argument contract of
worker commands, the controller's import path, the fixed environment, seeding at
creation, teardown order, warnings, and the caller's ``get_workers`` timeout.

Every backend where the behaviour is the backend's (``sched`` fixture); the local
scheduler where it is shared code. Physical GPUs are faked (declared device lists).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import sys
import textwrap
import uuid

import pytest

from corral import (
    BaseExperimentConfig,
    ConfigError,
    Job,
    LocalScheduler,
    SchedulingSpec,
    SchedulingStrategyType,
    WorkerTimeoutError,
)
from corral.rpc import wire
from tests.areal_compat.wire_types import Color, ConfigWithAClass, Sample, SeededConfig

ROLLOUT = "tests.areal_compat.engines.RecordingRolloutEngine"
AREAL_STYLE = "tests.areal_compat.areal_style_worker"


@pytest.fixture
def local(tmp_path):
    made = []

    def make(exp_config=None, **kwargs):
        kwargs.setdefault("gpu_devices", [])
        cfg = exp_config or BaseExperimentConfig(
            experiment_name="compat", trial_name=f"t{uuid.uuid4().hex[:6]}"
        )
        sched = LocalScheduler(exp_config=cfg, fileroot=str(tmp_path), **kwargs)
        made.append(sched)
        return sched

    yield make
    for sched in made:
        sched.close()


# ------------------------------------------------------------------ types on the wire
def test_worker_rebuilds_dataclasses_enums_and_dtypes_of_the_callers_modules(sched):
    torch = pytest.importorskip("torch")
    (wid,) = sched.create_workers(Job(role="types", replicas=1))
    asyncio.run(sched.create_engine(wid, ROLLOUT, "e"))
    kinds = sched.call_engine(
        wid,
        "kinds",
        "e",
        sample=Sample("hi", Color.blue),
        color=Color.red,
        strategy=SchedulingStrategyType.colocation,
        dtype=torch.bfloat16,
    )
    assert kinds == {
        "sample": "tests.areal_compat.wire_types.Sample",
        "color": "tests.areal_compat.wire_types.Color",
        "strategy": "corral.spec.SchedulingStrategyType",
        "dtype": "torch.dtype",
    }


def test_decoding_imports_modules_only_when_asked():
    frame = wire.encode_bytes({"s": Sample("x", Color.blue)})
    saved = sys.modules.pop("tests.areal_compat.wire_types")
    try:
        plain = wire.decode(frame)  # a reply, or an unauthenticated peer: no import
        assert "tests.areal_compat.wire_types" not in sys.modules
        assert isinstance(plain["s"], wire.DataclassRecord)
        assert plain["s"]["color"] == "blue"
        rebuilt = wire.decode(frame, import_types=True)  # an authenticated request
        assert "tests.areal_compat.wire_types" in sys.modules
        assert type(rebuilt["s"]).__name__ == "Sample"
        assert type(rebuilt["s"].color).__name__ == "Color"
    finally:
        sys.modules["tests.areal_compat.wire_types"] = saved


# ------------------------------------------------------------------ argument contract
def _argv_record(sched, role: str, index: int) -> dict:
    with open(os.path.join(str(sched.log_dir), f"argv-{role}-{index}.json")) as fh:
        return json.load(fh)


def test_forked_module_written_for_areal_gets_its_arguments(sched):
    sched.create_workers(Job(role="gen", replicas=2))
    ids = sched.fork_workers(role="proxy", target_role="gen", command=AREAL_STYLE)
    assert ids == ["proxy/0", "proxy/1"]
    for worker in sched.get_workers("proxy"):
        got = _argv_record(sched, "proxy", worker.index)
        assert got["role"] == "proxy" and got["worker_index"] == str(worker.index)
        assert got["experiment_name"] == sched.experiment_name
        assert got["trial_name"] == sched.trial_name
        assert got["fileroot"] == sched.fileroot
        if sched.backend != "ray":  # Ray's forks are actors: the port is the actor's
            assert got["host"] == "0.0.0.0" and int(got["port"]) == worker.port
        asyncio.run(sched.create_engine(worker.id, ROLLOUT, "e"))
        assert sched.call_engine(worker.id, "set_version", "e", 7) == 7


def test_spec_cmd_written_for_areal_gets_its_arguments(sched):
    job = Job(role="cmd", replicas=2, tasks=[SchedulingSpec(cmd=f"python -m {AREAL_STYLE}")])
    if sched.backend == "ray":
        with pytest.raises(ConfigError, match="cmd"):  # Ray runs workers as actors
            sched.create_workers(job)
        return
    sched.create_workers(job)
    for worker in sched.get_workers("cmd"):
        got = _argv_record(sched, "cmd", worker.index)
        assert got["role"] == "cmd" and got["worker_index"] == str(worker.index)
        assert got["name_resolve_type"] in ("nfs", "etcd3")
        if sched.backend == "local":
            assert int(got["port"]) == worker.port == int(worker.worker_ports[0])
        else:  # Slurm: the node is not known when the script is written
            assert got["port"] == "0" and worker.port > 0


def test_areal_rpc_server_command_runs_the_corral_worker(local):
    sched = local()
    spec = SchedulingSpec(cmd="python -m areal.infra.rpc.rpc_server")  # AReaL's default
    (wid,) = sched.create_workers(Job(role="w", replicas=1, tasks=[spec]))
    assert sched.health(wid)["status"] == "ok"


# ------------------------------------------------------------------ environment
def test_engine_module_next_to_the_training_script_imports_on_the_worker(local, tmp_path):
    name = f"nextdoor_{uuid.uuid4().hex[:8]}"
    script_dir = tmp_path / "script"
    script_dir.mkdir()
    (script_dir / f"{name}.py").write_text(
        textwrap.dedent(
            """
            class Engine:
                def hello(self):
                    return "from next door"
            """
        )
    )
    sys.path.insert(0, str(script_dir))  # what running a script from that folder does
    try:
        sched = local()
        (wid,) = sched.create_workers(Job(role="w", replicas=1))
        asyncio.run(sched.create_engine(wid, f"{name}.Engine", "e"))
        assert sched.call_engine(wid, "hello", "e") == "from next door"
    finally:
        sys.path.remove(str(script_dir))


def test_workers_get_arealsfixed_environment_and_thread_counts(local, monkeypatch):
    monkeypatch.setenv("MKL_NUM_THREADS", "5")  # the controller's setting beats cpu
    sched = local()
    spec = SchedulingSpec(cpu=3, env_vars={"NUMEXPR_NUM_THREADS": "2"})  # the spec's wins
    (wid,) = sched.create_workers(Job(role="w", replicas=1, tasks=[spec]))
    asyncio.run(sched.create_engine(wid, "corral.testing.engines.EchoEngine", "e"))
    env = {
        k: sched.call_engine(wid, "getenv", "e", k)
        for k in (
            "TOKENIZERS_PARALLELISM",
            "CUDA_DEVICE_MAX_CONNECTIONS",
            "PYTORCH_KERNEL_CACHE_PATH",
            "TRITON_CACHE_DIR",
            "VLLM_CACHE_ROOT",
            "OMP_NUM_THREADS",
            "MKL_NUM_THREADS",
            "NUMEXPR_NUM_THREADS",
            "PYTHONPATH",
        )  # fmt: skip
    }
    assert env["TOKENIZERS_PARALLELISM"] == "true" and env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert all(env[k] for k in ("PYTORCH_KERNEL_CACHE_PATH", "TRITON_CACHE_DIR", "VLLM_CACHE_ROOT"))
    assert (env["OMP_NUM_THREADS"], env["MKL_NUM_THREADS"], env["NUMEXPR_NUM_THREADS"]) == (
        "3",
        "5",
        "2",
    )
    assert env["PYTHONPATH"].split(os.pathsep)[0] == os.getcwd()


def test_offload_without_torch_memory_saver_is_a_config_error(local):
    if __import__("importlib").util.find_spec("torch_memory_saver") is not None:
        pytest.skip("torch_memory_saver is installed here")
    sched = local(enable_tms_offload=True)
    with pytest.raises(ConfigError, match="enable_tms_offload"):
        sched.create_workers(Job(role="w", replicas=1))
    assert sched.roles == []


# ------------------------------------------------------------------ creation
def test_workers_are_configured_and_seeded_at_creation(local):
    sched = local(SeededConfig(experiment_name="compat", trial_name="seeded", seed=41))
    ids = sched.create_workers(Job(role="w", replicas=2))
    for rank, wid in enumerate(ids):
        asyncio.run(sched.create_engine(wid, "tests.areal_compat.engines.SeedProbe", "p"))
        expected = random.Random(41 + rank).random()
        assert sched.call_engine(wid, "first_random", "p") == expected


def test_a_config_the_wire_cannot_carry_still_seeds_the_workers(local, caplog):
    cfg = ConfigWithAClass(experiment_name="compat", trial_name="unsendable", seed=5)
    with caplog.at_level(logging.WARNING, logger="corral"):
        sched = local(cfg)
        (wid,) = sched.create_workers(Job(role="w", replicas=1))
    assert "cannot be sent" in caplog.text
    asyncio.run(sched.create_engine(wid, "tests.areal_compat.engines.SeedProbe", "p"))
    assert sched.call_engine(wid, "first_random", "p") == random.Random(5).random()


def test_get_workers_honours_the_callers_timeout(local):
    sched = local()
    never = SchedulingSpec(cmd=f"{sys.executable} -c 'import time; time.sleep(600)'")
    ids = sched.create_workers(Job(role="slow", replicas=1, tasks=[never]), wait=False)
    assert ids == ["slow/0"]
    with pytest.raises(WorkerTimeoutError) as info:
        sched.get_workers("slow", timeout=1)
    assert info.value.worker_key == "slow" and info.value.timeout == 1
    assert sched.roles == ["slow"]  # still there: wait again or delete it
    sched.delete_workers("slow")
    assert sched.roles == []
    fast = sched.create_workers(Job(role="fast", replicas=2), wait=False)
    assert [w.id for w in sched.get_workers("fast", timeout=60)] == fast


# ------------------------------------------------------------------ teardown
def test_delete_workers_of_a_missing_role_warns(local, caplog):
    sched = local()
    with caplog.at_level(logging.WARNING, logger="corral"):
        sched.delete_workers("nobody")
    assert "nobody" in caplog.text


def test_reverse_order_stops_rank_zero_last(local, tmp_path):
    sched = local()
    ids = sched.create_workers(Job(role="train", replicas=3))
    order_file = str(tmp_path / "order")
    for wid in ids:
        asyncio.run(
            sched.create_engine(wid, "tests.areal_compat.engines.OrderProbe", "p", order_file, wid)
        )
    sched.delete_workers("train", reverse_order=True)
    with open(order_file) as fh:
        assert fh.read().split() == ["train/2", "train/1", "train/0"]


# ------------------------------------------------------------------ GPUs
def test_gpu_oversubscription_is_refused_by_default_and_shared_on_request(local, caplog):
    exclusive = local(gpu_devices=[0, 1])
    exclusive.create_workers(Job(role="a", replicas=2, tasks=[SchedulingSpec(gpu=1)]))
    with pytest.raises(ConfigError, match="GPUs are free"):
        exclusive.create_workers(Job(role="b", replicas=1, tasks=[SchedulingSpec(gpu=1)]))
    with caplog.at_level(logging.WARNING, logger="corral"):
        shared = local(gpu_devices=[0, 1], gpu_sharing="round_robin")
    assert "round_robin" in caplog.text
    shared.create_workers(Job(role="a", replicas=2, tasks=[SchedulingSpec(gpu=1)]))
    ids = shared.create_workers(Job(role="b", replicas=1, tasks=[SchedulingSpec(gpu=1)]))
    asyncio.run(shared.create_engine(ids[0], "corral.testing.engines.EchoEngine", "e"))
    assert shared.call_engine(ids[0], "getenv", "e", "CUDA_VISIBLE_DEVICES") == "0"
