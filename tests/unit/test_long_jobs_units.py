"""Pure parts of the long-job support: lease liveness, Slurm inventory fit and queue
reasons that never clear, Ray feasibility, requeue counting, the health monitor's
bookkeeping with a fake poll."""

from __future__ import annotations

import os
import socket
import time

import pytest

from corral.backends.ray.feasibility import infeasible
from corral.backends.slurm.inventory import Partition, fit_problem
from corral.backends.slurm.job_files import requeue_count
from corral.controller.health_monitor import HealthMonitor
from corral.controller.run_lease import Lease
from corral.launcher import WorkerExit

INV = {"debug": Partition("debug", {f"node{i}": 4 for i in range(1, 5)}, default=True)}


def test_lease_liveness():
    here = socket.gethostname()
    assert Lease("r", os.getpid(), here, time.time()).alive(5.0)
    assert not Lease("r", os.getpid(), here, time.time() - 60).alive(5.0)  # stale beat
    assert not Lease("r", 2**22 + 12345, here, time.time()).alive(5.0)  # pid gone here
    assert Lease("r", 1, "elsewhere", time.time()).alive(5.0)  # other host: beat decides
    assert Lease.parse("not json") is None
    assert Lease.parse(Lease("x", 1, "h", 2.0).dump()).run_id == "x"


def test_slurm_fit_problems():
    assert fit_problem(INV, None, 4, 4) is None
    assert fit_problem(INV, None, 5, 1)[0] == "nodes"
    assert fit_problem(INV, None, 1, 8)[0] == "gres"
    field, value, why = fit_problem(INV, "nopart", 1, 0)
    assert (field, value) == ("partition", "nopart") and "debug" in why
    assert fit_problem({}, None, 99, 99) is None  # unknown inventory: let Slurm decide


def test_ray_feasibility_uses_node_totals():
    nodes = [{"CPU": 8.0, "GPU": 4.0}, {"CPU": 8.0, "GPU": 4.0}]
    fmt = str
    assert infeasible([{"CPU": 1.0, "GPU": 1.0}] * 8, nodes, fmt) is None
    assert "in total" in infeasible([{"CPU": 1.0, "GPU": 1.0}] * 9, nodes, fmt)
    assert "no node" in infeasible([{"CPU": 1.0, "GPU": 5.0}], nodes, fmt)
    assert "no alive node" in infeasible([{"CPU": 1.0}], [], fmt)


def test_requeue_count_reads_slurmstepd_lines(tmp_path):
    log = tmp_path / "role.sbatch.log"
    log.write_text(
        "slurmstepd-node1: error: *** JOB 7 ON node1 CANCELLED AT 2026-12-03T09:33:19 "
        "DUE TO JOB REQUEUE ***\n"
        "slurmstepd-node1: error: *** JOB 8 ON node1 CANCELLED AT 2026-12-03T09:33:19 ***\n"
        "slurmstepd-node2: error: *** JOB 7 ON node2 CANCELLED AT 2026-12-03T09:40:00 "
        "DUE TO PREEMPTION ***\n"
    )
    assert requeue_count(str(log), "7") == 2
    assert requeue_count(str(log), "8") == 0
    assert requeue_count(str(tmp_path / "missing"), "7") == 0


def test_health_monitor_reports_each_death_once_and_survives_a_backend_outage():
    deaths: dict[int, WorkerExit] = {}
    answers = {"down": False}
    recorded, told = [], []

    def poll(role):
        if answers["down"]:
            raise RuntimeError("slurmctld does not answer")
        return dict(deaths)

    monitor = HealthMonitor(
        lambda: {"r": ["r/0", "r/1"]}, poll, lambda *a: recorded.append(a), lambda t: None
    )
    monitor.callbacks.append(lambda wid, exit_: told.append(wid))
    assert monitor.check_once() == []
    answers["down"] = True
    assert monitor.check_once() == []  # an outage is not a death
    assert monitor.outage_since is not None
    answers["down"] = False
    deaths[1] = WorkerExit("killed by SIGKILL", -9)
    assert monitor.check_once() == ["r/1"]
    assert monitor.check_once() == []  # once
    assert told == ["r/1"] and monitor.dead["r/1"].reason == "killed by SIGKILL"
    assert recorded[0][:2] == ("r", 1)
    monitor.forget("r/1")  # restarted: its successor is watched afresh
    assert monitor.check_once() == ["r/1"]


# --------------------------------------------------------------- re-attach, node loss
def test_the_worker_reads_the_grace_period_and_run_id_from_the_lease():
    from corral.worker.controller_watch import _lease_fields

    assert _lease_fields('{"run_id": "abc", "grace": 120}') == ("abc", 120.0)
    assert _lease_fields('{"run_id": "abc"}') == ("abc", 0.0)
    assert _lease_fields('{"run_id": "abc", "grace": "x"}') == ("abc", 0.0)
    assert _lease_fields("not json") == ("", 0.0)


@pytest.mark.parametrize("value", [-1, True, "60", None])
def test_outlive_controller_must_be_seconds_and_the_error_names_the_field(value):
    from corral.controller.adoption import check_grace
    from corral.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        check_grace(value)
    assert "outlive_controller" in str(info.value) and "attach=True" in str(info.value)


def test_a_ray_actor_death_counts_as_node_loss_only_when_its_node_died():
    from corral.backends.ray.node_loss import node_lost

    assert node_lost(RuntimeError("The actor died because its node has died. Node Id: 12ab"))
    assert not node_lost(RuntimeError("The actor died unexpectedly before finishing this task."))
    drained = RuntimeError("worker killed")
    drained.preempted = True  # Ray's flag for a node drained for preemption
    assert node_lost(drained)
