"""AReaL's TrainController sends data to data-parallel heads only; corral's workers hand
it to the other ranks of each head's group, as AReaL's RPC server does
(areal/infra/rpc/guard/engine_blueprint.py, ``_should_broadcast_payload`` and its use in
``call_engine_method``).

The real ``TrainController`` (installed ``areal``) drives four corral workers with
backend ``fsdp:d2t2``: two replicas of two ranks, on real torch.distributed (gloo, CPU;
tests/support/dp_engine.py has AReaL's TrainEngine interface).
"""

from __future__ import annotations

import torch

DP = "tests.support.dp_engine.DPGroupEngine"
OFF = {"broadcast": False}
NO_HANG = 60.0  # a lone call that waited for its group would fail the test, not hang it


def _controller(areal, sched):
    from tests.support.dp_engine import DPGroupEngine

    cli = areal["areal.api.cli_args"]
    spec = cli.SchedulingSpec(cpu=1, mem=1, gpu=0, container_type="none")
    config = cli.TrainEngineConfig(
        experiment_name=sched.experiment_name,
        trial_name=sched.trial_name,
        backend="fsdp:d2t2",
        scheduling_spec=(spec,),
    )
    controller_mod = areal["areal.infra.controller.train_controller"]
    controller = controller_mod.TrainController(DPGroupEngine, config, sched)
    controller.initialize(role="actor", ft_spec=areal["areal.api.io_struct"].FinetuneSpec(1, 8, 2))
    return controller


def _history(sched, controller) -> list[list[dict]]:
    """Each rank's calls, asked without a broadcast (one rank alone is not a group)."""
    return [
        sched.call_engine(w.id, "history", f"actor/{rank}", rpc_meta=OFF, http_timeout=NO_HANG)
        for rank, w in enumerate(controller.workers)
    ]


def test_train_controller_data_reaches_every_rank_of_each_dp_group(areal, sched):
    controller = _controller(areal, sched)
    # AReaL asked each engine (default broadcast once initialized: every rank answers)
    assert controller.workers_is_dp_head == [True, False, True, False]
    batch = [
        {
            "input_ids": torch.arange(4) + 10 * i,
            "attention_mask": torch.ones(4, dtype=torch.bool),
        }
        for i in range(4)
    ]
    # LMController.train_lm (areal/trainer/sft/lm_engine.py:53-56): broadcast=True
    controller._custom_function_call("train_lm", batch, rpc_meta={"broadcast": True})
    # TrainController.train (train_controller.py:635-649): no rpc_meta, AReaL's default
    controller.train(False)

    calls = _history(sched, controller)
    for rank in (1, 3):  # a non-head got its head's slice and its head's mode
        head_lm, other_lm = calls[rank - 1][-2], calls[rank][-2]
        assert len(head_lm["args"][0]) == 2  # the head's share of the 4 items
        for mine, heads in zip(other_lm["args"][0], head_lm["args"][0], strict=True):
            assert mine.keys() == heads.keys()
            assert all(torch.equal(mine[k], heads[k]) for k in mine)
        assert calls[rank][-1]["args"] == [False] == calls[rank - 1][-1]["args"]
    seen = sorted(int(item["input_ids"][0]) for r in (0, 2) for item in calls[r][-2]["args"][0])
    assert seen == [0, 10, 20, 30]  # the two heads split the batch between them
    controller.destroy()  # on failure the fixture stops the workers (no collective needed)


def test_train_controller_broadcast_false_leaves_non_heads_empty(areal, sched):
    controller = _controller(areal, sched)
    # as TrainController.clear_batches sends it (train_controller.py:836-839)
    controller._custom_function_call("received", ["s1", "s2"], rpc_meta=OFF)
    calls = _history(sched, controller)
    assert [c[-1]["args"] for c in calls] == [[["s1", "s2"]], [], [["s1", "s2"]], []]
    controller.destroy()  # on failure the fixture stops the workers (no collective needed)
