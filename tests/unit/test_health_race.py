"""A death found by the health monitor's poll while its role is being deleted is not
recorded: ``delete_workers`` clears the role's records, and a record written after that
would show in ``corral ps`` as a dead worker for ever. No process is started."""

from __future__ import annotations

from corral.controller.health_monitor import HealthMonitor
from corral.launcher import WorkerExit


def test_a_death_polled_while_its_role_is_deleted_is_not_recorded():
    watched = {"rollout": ["rollout/0", "rollout/1"]}
    recorded, announced = [], []

    def poll(role):  # the role is deleted while this poll runs (delete_workers)
        watched.pop(role)
        return {0: WorkerExit("killed by SIGKILL", -9)}

    monitor = HealthMonitor(
        roles=lambda: dict(watched),
        poll=poll,
        record=lambda role, index, health: recorded.append((role, index)),
        announce=announced.append,
    )
    assert monitor.check_once() == []
    assert recorded == [] and announced == [] and monitor.dead == {}


def test_a_death_of_a_watched_worker_is_still_recorded():
    watched = {"rollout": ["rollout/0"]}
    recorded = []
    monitor = HealthMonitor(
        roles=lambda: dict(watched),
        poll=lambda role: {0: WorkerExit("killed by SIGKILL", -9)},
        record=lambda role, index, health: recorded.append((role, index, health.state)),
        announce=lambda text: None,
    )
    assert monitor.check_once() == ["rollout/0"]
    assert recorded == [("rollout", 0, "dead")]
