"""``/dp_layout``: an engine's data-parallel layout, for ``dispatch(mode="engine")``.

Read from AReaL's ``TrainEngine`` interface: ``data_parallel_rank``,
``data_parallel_world_size`` (properties) and ``is_data_parallel_head()``."""

from __future__ import annotations

from corral.errors import EngineCallError

NEEDED = ("data_parallel_rank", "data_parallel_world_size", "is_data_parallel_head")


def layout(engine: object, engine_name: str) -> dict:
    missing = [n for n in NEEDED if not hasattr(engine, n)]
    if missing:
        raise EngineCallError(
            f"dispatch(mode='engine') reads the data-parallel layout of engine "
            f"{engine_name!r} ({type(engine).__name__}), which has no {', '.join(missing)}; "
            f"give it AReaL's TrainEngine interface ({', '.join(NEEDED)}) or use mode='split'"
        )
    return {
        "dp_rank": int(engine.data_parallel_rank),
        "dp_size": int(engine.data_parallel_world_size),
        "head": bool(engine.is_data_parallel_head()),
    }
