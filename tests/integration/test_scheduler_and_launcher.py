"""The shared Scheduler, on real local worker processes: what it asks its launcher
(one fork path, reverse stops, dry runs), AReaL's wait=False, and lookups."""

from __future__ import annotations

import logging

import pytest

from corral import BaseExperimentConfig, Job, LocalScheduler, WorkerNotFoundError
from corral.backends.local import LocalLauncher
from corral.launcher import ForkRequest
from corral.spec import SchedulingStrategy


class RecordingLauncher(LocalLauncher):
    """The local backend, noting what the scheduler asks of it."""

    def __init__(self) -> None:
        super().__init__(gpu_devices=[])
        self.asked: list[tuple] = []

    def fork(self, request: ForkRequest):
        self.asked.append(("fork", request.role, request.index, request.target.id))
        return super().fork(request)

    def stop_fork(self, worker, via_worker):
        self.asked.append(("stop_fork", worker.id))
        super().stop_fork(worker, via_worker)

    def stop(self, role, reverse=False):
        self.asked.append(("stop", role, reverse))
        super().stop(role, reverse)


@pytest.fixture
def local_sched(tmp_path):
    from corral.controller.scheduler import Scheduler

    class Recording(Scheduler):
        backend = "local"

    cfg = BaseExperimentConfig(experiment_name="sched", trial_name="t")
    s = Recording(
        exp_config=cfg, launcher=RecordingLauncher(), fileroot=str(tmp_path), startup_timeout=60
    )
    yield s
    s.close()


def test_every_fork_goes_through_the_launcher_and_back(local_sched):
    local_sched.create_workers(Job(role="host", replicas=2))
    forked = local_sched.create_workers(
        Job(role="kid", replicas=2, scheduling_strategy=SchedulingStrategy("colocation", "host"))
    )
    assert forked == ["kid/0", "kid/1"]
    asked = sorted(a for a in local_sched.launcher.asked if a[0] == "fork")
    assert asked == [("fork", "kid", 0, "host/0"), ("fork", "kid", 1, "host/1")]
    assert local_sched.health("kid/1")["status"] == "ok"  # the shared path (POST /fork) made it
    local_sched.delete_workers("kid")
    stops = sorted(a for a in local_sched.launcher.asked if a[0] == "stop_fork")
    assert stops == [("stop_fork", "kid/0"), ("stop_fork", "kid/1")]


def test_reverse_order_is_passed_to_the_launcher(local_sched):
    local_sched.create_workers(Job(role="a", replicas=1))
    local_sched.delete_workers("a", reverse_order=True)
    assert ("stop", "a", True) in local_sched.launcher.asked


def test_wait_false_returns_ids_at_once_and_get_workers_waits(local_sched):
    ids = local_sched.create_workers(Job(role="w", replicas=2), wait=False)
    assert ids == ["w/0", "w/1"]
    workers = local_sched.get_workers("w", timeout=60)
    assert [w.id for w in workers] == ids
    assert all(local_sched.health(w.id)["status"] == "ok" for w in workers)


def test_unknown_roles_and_workers(local_sched, caplog):
    with pytest.raises(WorkerNotFoundError, match="no role 'ghost'"):
        local_sched.get_workers("ghost")
    with pytest.raises(WorkerNotFoundError, match="no worker 'ghost/0'"):
        local_sched.health("ghost/0")
    with caplog.at_level(logging.WARNING, logger="corral"):
        local_sched.delete_workers("ghost")  # a warning, as in AReaL
    assert "no role 'ghost'" in caplog.text


def test_a_dry_run_scheduler_asks_the_launcher_for_nothing(tmp_path, capsys):
    cfg = BaseExperimentConfig(experiment_name="sched", trial_name="dry")
    launcher = RecordingLauncher()
    s = LocalScheduler(exp_config=cfg, fileroot=str(tmp_path / "r"), dry_run=True)
    s.launcher = launcher  # (LocalScheduler builds its own; swap in the recorder)
    try:
        assert s.create_workers(Job(role="w", replicas=1)) == []
        assert "# dry run (local)" in capsys.readouterr().out
        assert launcher.asked == [] and launcher.pids("w") == []
    finally:
        s.close()
    assert not (tmp_path / "r").exists()


def test_a_scheduler_that_cannot_start_closes_the_launcher_it_was_given(tmp_path):
    from corral.controller.scheduler import Scheduler
    from corral.errors import ConfigError

    closed = []

    class Closing(LocalLauncher):
        def close(self) -> None:
            closed.append(True)
            super().close()

    with pytest.raises(ConfigError, match="startup_timeout"):
        Scheduler(
            experiment_name="sched",
            trial_name="t",
            launcher=Closing(gpu_devices=[]),
            fileroot=str(tmp_path),
            startup_timeout="soon",
        )
    assert closed == [True]
