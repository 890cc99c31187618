"""Grouped colocation's arithmetic (corral.grouping): groups per node, contiguous and
non-overlapping, and the refusals that show the arithmetic and the fix."""

from __future__ import annotations

import pytest

from corral.errors import JobConfigError
from corral.grouping import TargetSlot, check_grouped, is_grouped, plan_groups
from corral.spec import Job, SchedulingSpec, SchedulingStrategy, normalize_job


def _job(role, replicas, gpu, target=None, fork=True):
    strategy = SchedulingStrategy("colocation", target, fork) if target else None
    return normalize_job(
        Job(role=role, replicas=replicas, tasks=[SchedulingSpec(gpu=gpu)],
            scheduling_strategy=strategy or SchedulingStrategy())
    )  # fmt: skip


def _slots(per_node: dict[str, int], gpu: int) -> list[TargetSlot]:
    """Target ranks filling each node in order, ``gpu`` devices each (ids from 0)."""
    slots = []
    for node, count in per_node.items():
        for k in range(count):
            devices = tuple(str(d) for d in range(k * gpu, (k + 1) * gpu))
            slots.append(TargetSlot(len(slots), node, devices))
    return slots


def test_sixteen_four_gpu_servers_over_sixty_four_one_gpu_actors():
    job = _job("rollout", 16, 4, "actor")
    groups = plan_groups(job, _slots({f"n{i}": 8 for i in range(8)}, 1))
    assert len(groups) == 16
    assert [g.devices for g in groups[:2]] == [("0", "1", "2", "3"), ("4", "5", "6", "7")]
    assert [g.node for g in groups] == [f"n{i // 2}" for i in range(16)]
    assert [g.host for g in groups[:4]] == [0, 4, 8, 12]  # rank holding the first device
    for node in {g.node for g in groups}:
        seen = [d for g in groups if g.node == node for d in g.devices]
        assert sorted(seen, key=int) == [str(d) for d in range(8)]  # disjoint, complete


def test_groups_follow_physical_ids_not_rank_order():
    job = _job("rollout", 1, 4, "actor")
    slots = [TargetSlot(0, "n", ("2", "3")), TargetSlot(1, "n", ("0", "1"))]
    (group,) = plan_groups(job, slots)
    assert group.devices == ("0", "1", "2", "3") and group.host == 1
    assert group.visible == "0,1,2,3"


def test_a_group_smaller_than_a_target_worker_splits_its_devices():
    groups = plan_groups(_job("r", 4, 1, "actor"), _slots({"n": 2}, 2))
    assert [(g.devices, g.host) for g in groups] == [
        (("0",), 0), (("1",), 0), (("2",), 1), (("3",), 1)
    ]  # fmt: skip


def test_a_node_that_cannot_be_cut_shows_the_arithmetic():
    with pytest.raises(JobConfigError) as info:
        plan_groups(_job("rollout", 3, 4, "actor"), _slots({"a": 6, "b": 6}, 1))
    text = str(info.value)
    assert "node a's 6 GPUs" in text and "6 % 4 = 2" in text, text
    assert "gpu that divides 6" in text, text


def test_unequal_totals_show_both_products_and_the_replicas_that_fit():
    target = _job("actor", 4, 2)
    with pytest.raises(JobConfigError) as info:
        check_grouped(_job("rollout", 3, 4, "actor"), target)
    text = str(info.value)
    assert "3 x 4 = 12 GPUs != 'actor''s 4 x 2 = 8" in text, text
    assert "replicas=2 (8 / 4)" in text and "replicas=4" in text, text
    check_grouped(_job("rollout", 2, 4, "actor"), target)  # 2 x 4 == 4 x 2


def test_fork_false_and_cpu_only_shapes_are_refused_with_the_fix():
    target = _job("actor", 4, 2)
    with pytest.raises(JobConfigError, match="needs replicas=4; use fork=True"):
        check_grouped(_job("rollout", 2, 4, "actor", fork=False), target)
    with pytest.raises(JobConfigError, match="gpu=0 per grouped worker"):
        check_grouped(_job("rollout", 2, 0, "actor"), target)


def test_only_a_differing_replica_count_is_grouped():
    assert is_grouped(_job("r", 2, 4, "actor"), 4)
    assert not is_grouped(_job("r", 4, 2, "actor"), 4)
    assert not is_grouped(_job("r", 2, 4), 4)


def test_targets_that_report_fewer_devices_are_refused():
    slots = [TargetSlot(0, "n", ()), TargetSlot(1, "n", ("0", "1"))]
    with pytest.raises(JobConfigError, match="report 2 visible GPUs"):
        plan_groups(_job("r", 2, 2, "actor"), slots)
