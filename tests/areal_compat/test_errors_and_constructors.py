"""AReaL's exception forms and scheduler constructors, on corral's classes.

Code written for AReaL builds and inspects the errors with AReaL's arguments, catches
the AReaL-named class for each refusal, and constructs schedulers with AReaL's keywords.
"""

from __future__ import annotations

import asyncio

import pytest

import corral
from corral import (
    BaseExperimentConfig,
    ConfigError,
    EngineCallError,
    EngineCreationError,
    EngineImportError,
    GPUAllocationError,
    Job,
    LocalScheduler,
    PortAllocationError,
    RPCConnectionError,
    SchedulingSpec,
    SchedulingStrategy,
    SchedulingStrategyType,
    WorkerConfigurationError,
    WorkerCreationError,
    WorkerFailedError,
    WorkerNotFoundError,
    WorkerTimeoutError,
)


def test_areal_constructor_forms_and_attributes():
    failed = WorkerFailedError("actor/0", 137, "Killed")
    assert (failed.worker_id, failed.exit_code, failed.stderr) == ("actor/0", 137, "Killed")
    call = EngineCallError("actor/0", "train_batch", "CUDA OOM", 3)
    assert (call.worker_id, call.method, call.reason, call.attempt) == (
        "actor/0", "train_batch", "CUDA OOM", 3,
    )  # fmt: skip
    timeout = WorkerTimeoutError("rollout", 30.0)
    assert (timeout.worker_key, timeout.timeout) == ("rollout", 30.0)
    assert isinstance(timeout, TimeoutError)
    created = WorkerCreationError("rollout", "Invalid configuration", "replicas=0")
    assert (created.worker_key, created.reason, created.details) == (
        "rollout", "Invalid configuration", "replicas=0",
    )  # fmt: skip
    configured = WorkerConfigurationError("rollout/0", "bad config", "500")
    assert (configured.worker_key, configured.reason, configured.details) == (
        "rollout/0", "bad config", "500",
    )  # fmt: skip
    engine = EngineCreationError("actor/0", "boom", 500)
    assert (engine.worker_id, engine.reason, engine.status_code) == ("actor/0", "boom", 500)
    imported = EngineImportError("pkg.Engine", "no module named pkg")
    assert (imported.import_path, imported.reason) == ("pkg.Engine", "no module named pkg")
    assert isinstance(imported, EngineCreationError) and isinstance(imported, ImportError)
    rpc = RPCConnectionError("actor/0", "10.0.0.1", 8000, "refused")
    assert (rpc.worker_id, rpc.host, rpc.port, rpc.reason) == (
        "actor/0",
        "10.0.0.1",
        8000,
        "refused",
    )
    assert WorkerNotFoundError("x/0").worker_id == "x/0"
    assert PortAllocationError("none left").reason == "none left"
    assert GPUAllocationError("none left").reason == "none left"
    for cls in (WorkerFailedError, EngineCallError, WorkerTimeoutError, WorkerNotFoundError):
        assert issubclass(cls, corral.SchedulerError)


@pytest.fixture
def local_sched(tmp_path):
    cfg = BaseExperimentConfig(experiment_name="compat", trial_name="errors")
    s = LocalScheduler(gpu_devices=[0], exp_config=cfg, fileroot=str(tmp_path))
    yield s
    s.close()


def test_each_refusal_is_the_class_areal_raises_and_a_config_error(local_sched):
    local_sched.create_workers(Job(role="base", replicas=1))
    cases = [
        (Job(role="base", replicas=1), WorkerCreationError, "already exists"),
        (Job(role="z", replicas=0), WorkerCreationError, "replicas must be greater than 0"),
        (Job(role="z", replicas=2, tasks=[]), ValueError, "No scheduling specs"),
        (
            Job(role="z", replicas=3, tasks=[SchedulingSpec(), SchedulingSpec()]),
            WorkerCreationError,
            "must be 1 or match",
        ),
        (
            Job(role="z", replicas=2, scheduling_strategy=SchedulingStrategy("colocation", "base")),
            WorkerCreationError,
            "Replica count mismatch",
        ),
        (
            Job(
                role="z",
                replicas=1,
                scheduling_strategy=SchedulingStrategy(SchedulingStrategyType.colocation, "nobody"),
            ),
            WorkerNotFoundError,
            "create that role first",
        ),
        (
            Job(role="z", replicas=1, scheduling_strategy=SchedulingStrategy("colocation", "")),
            WorkerNotFoundError,
            "Colocation strategy requires target",
        ),
        (Job(role="z", replicas=1, tasks=[SchedulingSpec(gpu=2)]), GPUAllocationError, "gpu"),
    ]
    for job, areal_class, phrase in cases:
        with pytest.raises(areal_class, match=phrase) as info:
            local_sched.create_workers(job)
        assert isinstance(info.value, ConfigError)  # corral's class, naming the field
    assert local_sched.roles == ["base"]


def test_engine_errors_are_the_classes_areal_raises(local_sched):
    (wid,) = local_sched.create_workers(Job(role="e", replicas=1))
    with pytest.raises(EngineCreationError, match="must be a string"):
        asyncio.run(local_sched.create_engine(wid, 123))
    with pytest.raises(EngineCreationError):
        asyncio.run(local_sched.create_engine(wid, "nonexistent.module.Engine"))
    with pytest.raises(WorkerNotFoundError):
        asyncio.run(local_sched.create_engine("nobody/0", "x.Engine"))
    asyncio.run(local_sched.create_engine(wid, "corral.testing.engines.EchoEngine", "echo"))
    with pytest.raises(EngineCallError) as info:
        local_sched.call_engine(wid, "no_such_method", "echo")
    assert (info.value.worker_id, info.value.method) == (wid, "no_such_method")


def test_local_scheduler_takes_areals_signature(tmp_path):
    log_dir = tmp_path / "logs here"
    s = LocalScheduler(
        [0, 1],
        str(log_dir),
        45.0,
        2.0,
        experiment_name="exp",
        trial_name="trial",
        fileroot=str(tmp_path / "root"),
        name_resolve_type="nfs",
        nfs_record_root=str(tmp_path / "nr"),
    )
    try:
        assert s.gpu_devices == [0, 1]
        assert s.log_dir == log_dir and log_dir.is_dir()
        assert (s.startup_timeout, s.health_check_interval) == (45.0, 2.0)
        assert (s.experiment_name, s.trial_name) == ("exp", "trial")
        assert s.name_resolve.describe()["root"] == str(tmp_path / "nr")
    finally:
        s.close()


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"gpu_devices": "0,1"}, "gpu_devices"),
        ({"gpu_devices": [0, 0]}, "gpu_devices"),
        ({"log_dir": 5}, "log_dir"),
        ({"startup_timeout": "soon"}, "startup_timeout"),
        ({"health_check_interval": -1}, "health_check_interval"),
        ({"experiment_name": 3}, "experiment_name"),
        ({"name_resolve_type": "zookeeper"}, "name_resolve_type"),
        ({"etcd3_addr": 2379}, "etcd3_addr"),
        ({"enable_tms_offload": "yes"}, "enable_tms_offload"),
        ({"exp_config": [0, 1]}, "exp_config"),
        ({"gpu_sharing": "sometimes"}, "gpu_sharing"),
    ],
)
def test_a_wrong_type_is_a_config_error_naming_the_keyword(tmp_path, kwargs, field):
    kwargs.setdefault("fileroot", str(tmp_path))
    with pytest.raises(ConfigError) as info:
        LocalScheduler(**kwargs)
    assert info.value.field == field


def test_an_explicit_config_wins_over_keywords_as_in_areal(tmp_path):
    from corral.backends.slurm.scheduler import SlurmScheduler

    cfg = BaseExperimentConfig(experiment_name="from_config", trial_name="t1")
    cfg.cluster.n_gpus_per_node = 4
    s = SlurmScheduler(
        n_gpus_per_node=8,
        experiment_name="keyword",
        trial_name="keyword",
        fileroot=str(tmp_path),
        exp_config=cfg,
        dry_run=True,
    )
    try:
        assert (s.n_gpus_per_node, s.experiment_name, s.trial_name) == (4, "from_config", "t1")
    finally:
        s.close()
    with pytest.raises(ValueError, match="experiment_name and trial_name must be provided"):
        SlurmScheduler(dry_run=True)


def test_local_n_gpus_per_node_is_the_number_of_gpu_devices_as_in_areal(tmp_path):
    """AReaL's LocalScheduler.n_gpus_per_node is len(gpu_devices) (issue 24, defect 5);
    an explicit n_gpus_per_node keyword still wins."""
    s = LocalScheduler(gpu_devices=[0, 1], fileroot=str(tmp_path))
    try:
        assert s.n_gpus_per_node == 2
    finally:
        s.close()
    s = LocalScheduler(gpu_devices=[0, 1], fileroot=str(tmp_path), n_gpus_per_node=4)
    try:
        assert s.n_gpus_per_node == 4
    finally:
        s.close()


def test_every_scheduler_takes_a_config_first_beside_any_keyword(tmp_path):
    """``Scheduler(cfg, startup_timeout=60)`` is the same on every backend (issue 24,
    defect 6): Ray raised Python's 'got multiple values for argument'."""
    from corral.backends.ray.scheduler import RayScheduler
    from corral.backends.slurm.scheduler import SlurmScheduler

    cfg = BaseExperimentConfig(experiment_name="first", trial_name="t1")
    cfg.cluster.fileroot = str(tmp_path)
    made = [
        LocalScheduler(cfg, startup_timeout=60, gpu_devices=[0]),
        RayScheduler(cfg, startup_timeout=60, dry_run=True),
        SlurmScheduler(cfg, n_gpus_per_node=4, startup_timeout=60, dry_run=True),
    ]
    try:
        for s in made:
            assert (s.experiment_name, s.startup_timeout) == ("first", 60.0), type(s).__name__
            assert s.exp_config is cfg
    finally:
        for s in made:
            s.close()
    with pytest.raises(ConfigError, match="pass the experiment config once") as info:
        LocalScheduler(cfg, exp_config=cfg)
    assert info.value.field == "exp_config"
