"""The local backend's parts (corral.backends.local): the GPU ledger, and the capability
parts composed from it and the table of running workers. No process is started."""

from __future__ import annotations

import pytest

from corral.backends.local import (
    GpuLedger,
    LocalAdoption,
    LocalCommands,
    LocalElastic,
    LocalLauncher,
)
from corral.capabilities import Adoptable, Elastic, ServesCommands, require
from corral.errors import GPURequestError, SchedulerError
from corral.foreign import ServedAt
from corral.launcher import Launcher
from corral.spec import Worker


def test_the_launcher_is_one_class_and_its_parts_are_objects_it_holds():
    launcher = LocalLauncher(gpu_devices=[0, 1])
    assert LocalLauncher.__bases__ == (Launcher,)
    parts = {
        "elastic": (LocalElastic, Elastic),
        "adoption": (LocalAdoption, Adoptable),
        "commands": (LocalCommands, ServesCommands),
    }
    for name, (cls, interface) in parts.items():
        part = getattr(launcher, name)
        assert part is not launcher and isinstance(part, cls) and isinstance(part, interface)
    assert require(launcher, "elastic", "grow", "role", "r") is launcher.elastic
    # the parts share the launcher's state, not copies of it
    assert launcher.elastic.workers is launcher.workers is launcher.adoption.workers
    assert launcher.elastic.gpus is launcher.gpus


def test_exclusive_gpus_are_taken_once_and_given_back_sorted():
    ledger = GpuLedger([0, 1, 2, 3], "exclusive")
    assert ledger.take(2) == [0, 1]
    assert ledger.take(1) == [2]
    assert ledger.free == [3]
    with pytest.raises(GPURequestError, match="fix it"):
        ledger.refuse_over_free(2, "role: gpu", "fix it", "role")
    ledger.give_back([[2], [0, 1]])
    assert ledger.free == [0, 1, 2, 3]
    ledger.refuse_over_free(4, "role: gpu", "fix it", "role")  # all free again: no error


def test_round_robin_gpus_go_in_turn_and_are_never_refused():
    ledger = GpuLedger([0, 1, 2], "round_robin")
    assert ledger.take(2) == [0, 1]
    assert ledger.take(2) == [2, 0]
    ledger.refuse_over_free(10, "role: gpu", "fix it", "role")
    ledger.give_back([[0, 1]])
    assert ledger.free == [0, 1, 2]  # shared devices are never taken off the free list


def test_a_dry_run_preview_takes_nothing():
    ledger = GpuLedger([0, 1, 2], "exclusive")
    assert ledger.preview([1, 2]) == [[0], [1, 2]]
    assert ledger.free == [0, 1, 2]
    turns = GpuLedger([0, 1], "round_robin")
    assert turns.preview([1, 1, 1]) == [[0], [1], [0]] and turns.turn == 0


def test_commands_answer_where_a_worker_command_serves():
    launcher = LocalLauncher(gpu_devices=[])
    at = ServedAt("10.0.0.1", [4000], launcher.host, 123)
    launcher.workers.served[("srv", 0)] = at
    assert launcher.commands.served_at("srv", 0) is at
    assert launcher.commands.served_at("srv", 1) is None


def test_adoption_refuses_a_worker_on_another_host_before_taking_anything():
    launcher = LocalLauncher(gpu_devices=[])
    elsewhere = Worker(id="w/0", ip="10.0.0.9", role="w", index=0, host="elsewhere", pid=4242)
    with pytest.raises(SchedulerError, match="attach from that host"):
        launcher.adoption.adopt("w", [elsewhere], "/tmp/logs")
    assert "w" not in launcher.workers.procs
