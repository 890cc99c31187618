"""RolloutController's calls, replayed exactly against corral on every backend.

AReaL's RolloutController needs an inference server and a callback server to start, so
its scheduler calls are replayed here as written in areal 1.0.4,
``areal/infra/controller/rollout_controller.py`` (line numbers cite that file). The
engine is ``tests.areal_compat.engines.RecordingRolloutEngine``: its methods have no
``http_timeout`` parameter, so a scheduler that forwarded the option would fail.
"""

from __future__ import annotations

import asyncio

import pytest

from corral import ConfigError, Job, SchedulingSpec
from tests.areal_compat.engines import RecordingRolloutEngine
from tests.areal_compat.wire_types import Sample

ENGINE = f"{RecordingRolloutEngine.__module__}.{RecordingRolloutEngine.__name__}"  # :260


def _engine_name(rank: int) -> str:
    return f"rollout/{rank}"


def test_rollout_controller_call_patterns(sched):
    job = Job(role="rollout", replicas=2, tasks=[SchedulingSpec(cpu=1, mem=1)])
    worker_ids = sched.create_workers(job=job)  # :244
    workers = sched.get_workers(role=job.role)  # :249
    assert [w.id for w in workers] == worker_ids == ["rollout/0", "rollout/1"]

    async def create_and_initialize():
        created = await asyncio.gather(
            *[
                sched.create_engine(  # :258
                    worker_id=w.id, engine=ENGINE, engine_name=_engine_name(r), config=Sample("c")
                )
                for r, w in enumerate(workers)
            ]
        )
        assert created == [None, None]  # AReaL's create_engine returns None
        return await asyncio.gather(
            *[
                sched.async_call_engine(  # :298
                    worker_id=w.id,
                    method="initialize",
                    engine_name=_engine_name(r),
                    engine_id=str(r),
                )
                for r, w in enumerate(workers)
            ]
        )

    assert asyncio.run(create_and_initialize()) == ["0", "1"]

    async def submit_and_wait():
        task_id = await sched.async_call_engine(  # :800
            workers[0].id,
            "submit",
            engine_name=_engine_name(0),
            data={"prompt": "hi"},
            workflow=None,
            workflow_kwargs={},
            should_accept_fn=None,
            http_timeout=3600.0,
            is_eval=False,
            group_size=1,
        )
        return await sched.async_call_engine(  # :822
            workers[0].id,
            "wait_for_task",
            engine_name=_engine_name(0),
            task_id=task_id,
            timeout=0.1,  # the engine's own argument, passed through
            raise_timeout=False,
            http_timeout=3600.0,
        )

    assert asyncio.run(submit_and_wait()) == {"task": 0, "data": {"prompt": "hi"}}

    logp = asyncio.run(
        sched.async_call_engine(  # :1005
            worker_id=workers[1].id,
            method="compute_logp",
            engine_name=_engine_name(1),
            data=["ab", "abc"],
            http_timeout=3600.0,
        )
    )
    assert logp == [2.0, 3.0]

    def collective(method: str, **kwargs):  # _collective_rpc, :697
        async def run():
            return await asyncio.gather(
                *[
                    sched.async_call_engine(
                        worker_id=w.id, method=method, engine_name=_engine_name(r), **kwargs
                    )
                    for r, w in enumerate(workers)
                ]
            )

        return asyncio.run(run())

    assert collective("set_version", version=3, http_timeout=60.0) == [3, 3]  # :1095
    assert collective("pause", http_timeout=60.0) == [None, None]  # :1107
    assert (
        collective("config_perf_tracer", rank=0, role="rollout", config=Sample("p"))
        == ["rollout:0:tests.areal_compat.wire_types.Sample"] * 2
    )  # :1136
    assert collective("destroy", http_timeout=60.0) == [None, None]  # :320
    sched.delete_workers(role="rollout")  # :325
    assert sched.roles == []


def test_scheduler_options_are_checked_and_never_reach_the_engine(sched):
    (wid,) = sched.create_workers(Job(role="r", replicas=1))
    asyncio.run(sched.create_engine(wid, ENGINE, "e"))
    assert (
        sched.call_engine(wid, "kinds", "e", http_timeout=30, max_retries=2, retry_delay=0.5) == {}
    )
    with pytest.raises(ConfigError, match="max_retries"):
        sched.call_engine(wid, "kinds", "e", max_retries=0)
    with pytest.raises(ConfigError, match="http_timeout"):
        sched.call_engine(wid, "kinds", "e", http_timeout="soon")
    with pytest.raises(ConfigError, match="retry_delay"):
        asyncio.run(sched.async_call_engine(wid, "kinds", "e", retry_delay=-1))
