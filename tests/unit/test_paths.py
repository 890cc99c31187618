"""TrialPaths: the one place that names a trial's files."""

from __future__ import annotations

import os

from corral import paths
from corral.paths import TrialPaths


def test_controller_and_worker_name_the_same_files():
    controller = TrialPaths.of("/root", "exp", "t1")
    worker = TrialPaths.at(controller.log_dir)
    assert controller.log_dir == os.path.join(paths.logs_root("/root"), "exp", "t1")
    assert controller.replica_log("actor", 3) == worker.replica_log("actor", 3)
    assert (
        controller.role_log("actor")
        == worker.role_log("actor")
        == f"{controller.log_dir}/actor.log"
    )
    assert controller.merged_log() == f"{controller.log_dir}/merged.log"
    assert controller.replica_log("actor", 3) == f"{controller.log_dir}/actor/3.log"


def test_slurm_job_files_are_named_from_the_log_directory():
    from corral.backends.slurm.job_files import JobFiles

    files = JobFiles(TrialPaths.of("/root", "exp", "t1").log_dir)
    log_dir = files.log_dir
    assert files.exit_file("actor", 3) == f"{log_dir}/actor/3.exit"
    assert files.exit_file("actor", 3, "41") == f"{log_dir}/actor/3.41.exit"
    assert files.place_file("actor", 3) == f"{log_dir}/actor/3.place"
    assert files.batch_log("actor") == f"{log_dir}/actor.sbatch.log"
    assert files.batch_script("actor") == f"{log_dir}/actor.sbatch"
    assert files.grow_script("actor", 4) == f"{log_dir}/actor.grow4.sbatch"
    assert files.restart_script("actor", 2, 1) == f"{log_dir}/actor.2.restart1.sbatch"


def test_secret_and_records_live_under_the_fileroot():
    p = TrialPaths.of("/root", "exp", "t1")
    assert p.secret_file == "/root/secrets/exp/t1/secret"
    assert p.records == "/root/name_resolve" == paths.records_root("/root")


def test_paths_from_a_log_dir_know_no_secret():
    import pytest

    with pytest.raises(ValueError, match="log directory only"):
        _ = TrialPaths.at("/logs/x").secret_file


def test_scheduler_cli_and_name_resolve_use_these_paths(tmp_path):
    from corral import BaseExperimentConfig, LocalScheduler
    from corral.cli import _name_resolve, build_parser

    cfg = BaseExperimentConfig(experiment_name="e", trial_name="t")
    sched = LocalScheduler(exp_config=cfg, fileroot=str(tmp_path), gpu_devices=[])
    try:
        expected = TrialPaths.of(str(tmp_path), "e", "t")
        assert str(sched.log_dir) == expected.log_dir
        assert sched.secret_file == expected.secret_file
        assert sched.name_resolve.describe()["root"] == expected.records
    finally:
        sched.close()
    args = build_parser().parse_args(["--fileroot", str(tmp_path), "ps"])
    assert _name_resolve(args).describe()["root"] == expected.records
