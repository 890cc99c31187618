"""AReaL 1.0.4's own TrainController drives corral's schedulers, unchanged.

``areal.infra.controller.train_controller.TrainController`` is imported from the
installed ``areal`` package and given a corral scheduler (every backend). Its engine is
``RecordingTrainEngine`` (AReaL's FSDP engine needs GPUs); the spec is AReaL's own
``SchedulingSpec`` with AReaL's default worker command, minus the container (corral does
not start apptainer unless asked; see docs/areal.md).
"""

from __future__ import annotations

import os
import random
import uuid

from corral import LocalScheduler
from tests.areal_compat.engines import RecordingTrainEngine


def _train_config(areal, experiment: str, trial: str):
    cli = areal["areal.api.cli_args"]
    spec = cli.SchedulingSpec(
        cpu=1, mem=1, gpu=0, container_type="none", cmd="python -m areal.infra.rpc.rpc_server"
    )
    return cli.TrainEngineConfig(
        experiment_name=experiment, trial_name=trial, backend="fsdp:d2", scheduling_spec=(spec,)
    )


def test_train_controller_runs_on_corral(areal, sched):
    controller_mod = areal["areal.infra.controller.train_controller"]
    io = areal["areal.api.io_struct"]
    config = _train_config(areal, sched.experiment_name, sched.trial_name)
    controller = controller_mod.TrainController(RecordingTrainEngine, config, sched)

    controller.initialize(role="actor", ft_spec=io.FinetuneSpec(1, 8, 2))

    workers = sched.get_workers("actor")
    assert [w.id for w in workers] == ["actor/0", "actor/1"]
    assert controller.workers_is_dp_head == [True, True]
    master_port = workers[0].worker_ports[1]  # what TrainController reads (worker_ports[1])
    for rank, worker in enumerate(workers):
        report = sched.call_engine(worker.id, "report", f"actor/{rank}")
        assert report["config_type"] == "areal.api.cli_args.TrainEngineConfig"
        assert report["experiment_name"] == sched.experiment_name
        assert report["parallel_strategy_type"] == "areal.api.alloc_mode.ParallelStrategy"
        assert report["ft_spec_type"] == "areal.api.io_struct.FinetuneSpec"
        assert report["calls"] == ["__init__", "create_process_group", "initialize"]
        env = report["env"]
        assert (env["RANK"], env["WORLD_SIZE"], env["MASTER_PORT"]) == (str(rank), "2", master_port)
        assert os.getcwd() in env["PYTHONPATH"].split(os.pathsep)
    assert controller.export_stats()["loss"] == 0.5

    controller.destroy()  # engines' destroy(), then delete_workers(role, reverse_order=True)
    assert sched.roles == []


def test_areal_experiment_config_is_sent_to_workers_and_seeds_them(areal, tmp_path):
    cli = areal["areal.api.cli_args"]
    cfg = cli.BaseExperimentConfig(experiment_name="areal", trial_name=f"t{uuid.uuid4().hex[:6]}")
    cfg.seed = 123
    cfg.cluster.fileroot = str(tmp_path)
    cfg.cluster.name_resolve.nfs_record_root = str(tmp_path / "name_resolve")
    sched = LocalScheduler(gpu_devices=[], exp_config=cfg)  # AReaL's config, as is
    try:
        import asyncio

        from corral import Job

        ids = sched.create_workers(Job(role="w", replicas=2))
        for rank, wid in enumerate(ids):
            asyncio.run(sched.create_engine(wid, "tests.areal_compat.engines.SeedProbe", "p"))
            assert sched.call_engine(wid, "first_random", "p") == random.Random(123 + rank).random()
        assert sched.fileroot == str(tmp_path)
    finally:
        sched.close()
