"""A new role's start: ``/configure`` (the experiment config) goes out with the rendezvous
``/set_env`` of the same workers, in one gather on the same pipelined connections, whose
pool is then emptied (issue 29: one round trip to each worker, not two)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from corral.controller.launch import finish_role
from corral.spec import SchedulingSpec, Worker


class RecordingCaller:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.forgotten = False
        self.async_client = self

    async def acall(self, worker: Worker, path: str, payload: object) -> None:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        await asyncio.sleep(0)  # every request is sent before any reply is taken
        self.sent.append((worker.id, path))
        self.in_flight -= 1

    async def acall_all(self, requests: list) -> None:
        try:
            await asyncio.gather(*(self.acall(w, path, body) for w, path, body in requests))
        finally:
            self.forget_all()

    def forget_all(self) -> None:
        self.forgotten = True


def test_a_new_roles_rendezvous_and_configure_are_one_round_trip():
    """``launch.finish_role``: one run on the controller's loop, every request in flight
    at once, for a role started with an experiment config."""
    workers = [Worker.from_registration("w", i, f"127.0.0.1:{9000 + i}", {}) for i in range(2)]
    state = SimpleNamespace(
        job=SimpleNamespace(replicas=2, tasks=[SchedulingSpec(cpu=1, gpu=0)]), pending=True
    )
    caller, runs = RecordingCaller(), []
    c = SimpleNamespace(
        table=SimpleNamespace(roles={"w": state}, add_workers=lambda found: None),
        watch=SimpleNamespace(await_registration=lambda role, n, timeout: workers),
        launcher=SimpleNamespace(rendezvous_master=lambda role, found: ("127.0.0.1", 9100)),
        caller=caller,
        io=SimpleNamespace(run=lambda coro: runs.append(coro) or asyncio.run(coro)),
        exp_config={"seed": 1},
        n_gpus_per_node=8,
        progress=lambda text: None,
    )
    finish_role(c, "w", 60.0)
    assert sorted(caller.sent) == [
        ("w/0", "/configure"), ("w/0", "/set_env"), ("w/1", "/configure"), ("w/1", "/set_env"),
    ]  # fmt: skip
    assert len(runs) == 1 and caller.most_in_flight == 4  # not the rendezvous, then the config
    assert caller.forgotten and state.workers == workers and not state.pending
