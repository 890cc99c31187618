"""A data-parallel head's call arguments, shared with the rest of its group.

AReaL's controllers send a call's data only to the data-parallel (DP) head of each group
of ranks that hold one model replica (tensor, pipeline and context parallel ranks); the
other ranks of the group get an empty call. Before the engine method runs, every rank of
the group takes part in a ``torch.distributed`` broadcast from the head, so each rank
calls the method with the head's arguments. That happens when the call's
``rpc_meta["broadcast"]`` is True, or, when it is left out, for an engine with AReaL's
``TrainEngine`` interface once it is ``initialized``; ``broadcast: False`` turns it off.

The engine interface used (AReaL's ``TrainEngine``): ``initialized``,
``current_data_parallel_head()`` (the head's global rank) and
``context_and_model_parallel_group`` (the process group; None is the default group).

torch is imported only when a broadcast happens. Lists, tuples and dicts are walked:
their tensors go by ``dist.broadcast`` on the device the group's backend uses (the current
CUDA device for NCCL, the CPU otherwise), everything else in one pickled message.
"""

from __future__ import annotations

from corral.errors import EngineCallError, ProtocolError

TYPE_CHECKING = False  # typing's, without importing typing (a worker's start)
if TYPE_CHECKING:
    from typing import Any

#: What an engine needs for its calls to be broadcast (AReaL's TrainEngine interface).
INTERFACE = ("initialized", "current_data_parallel_head", "context_and_model_parallel_group")


def parse_flag(value: Any) -> bool | None:
    """The ``broadcast`` field of a ``/call`` request: True, False or absent (None)."""
    if value is None or isinstance(value, bool):
        return value
    raise ProtocolError(
        f"rpc_meta['broadcast']={value!r} is invalid: send True, False or leave it out "
        f"(got {type(value).__name__})"
    )


def _has(engine: Any, name: str) -> bool:
    # on the class first: reading a property of an engine not yet set up may raise
    return hasattr(type(engine), name) or name in getattr(engine, "__dict__", {})


def is_train_engine(engine: Any) -> bool:
    """Whether the engine exposes AReaL's TrainEngine interface (:data:`INTERFACE`)."""
    cls, attrs = type(engine), getattr(engine, "__dict__", {})
    for name in INTERFACE:  # ``_has`` of each, without a call per name (every engine call)
        if not (hasattr(cls, name) or name in attrs):
            return False
    return True


def wanted(engine: Any, flag: bool | None) -> bool:
    """AReaL's rule: the caller's flag, else broadcast for an initialized TrainEngine."""
    if flag is not None:
        return flag
    return is_train_engine(engine) and bool(engine.initialized)


class _Slot:
    """Where the n-th broadcast tensor goes back in the arguments."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __reduce__(self):
        return (_Slot, (self.index,))


def _lift(value: Any, tensors: list, torch: Any, device: Any) -> Any:
    """``value`` with each tensor (moved to ``device``) replaced by a :class:`_Slot`."""
    if isinstance(value, torch.Tensor):
        tensors.append(value.to(device).contiguous())
        return _Slot(len(tensors) - 1)
    kind = type(value)
    if kind is list or kind is tuple:
        return kind(_lift(v, tensors, torch, device) for v in value)
    if kind is dict:
        return {k: _lift(v, tensors, torch, device) for k, v in value.items()}
    return value


def _lower(value: Any, tensors: list) -> Any:
    if isinstance(value, _Slot):
        return tensors[value.index]
    kind = type(value)
    if kind is list or kind is tuple:
        return kind(_lower(v, tensors) for v in value)
    if kind is dict:
        return {k: _lower(v, tensors) for k, v in value.items()}
    return value


def _device(torch: Any, dist: Any, group: Any) -> Any:
    backend = str(dist.get_backend(group)).lower()
    if "nccl" in backend and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def share(engine: Any, engine_name: str, method: str, args: list, kwargs: dict):
    """Every rank of the engine's group calls this together; all return the head's
    ``(args, kwargs)``. Raises EngineCallError naming what is missing."""
    fix = "or send the call with rpc_meta={'broadcast': False}"
    missing = [n for n in INTERFACE[1:] if not _has(engine, n)]
    if missing:
        raise EngineCallError(
            f"{method!r} on engine {engine_name!r} ({type(engine).__name__}) asks for a "
            f"broadcast from its data-parallel head, but the engine has no "
            f"{', '.join(missing)}; give it AReaL's TrainEngine interface ({', '.join(INTERFACE)}) "
            + fix
        )
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise EngineCallError(
            f"{method!r} on engine {engine_name!r} asks for a broadcast from its data-parallel "
            "head, but torch.distributed is not initialized in this worker; create the "
            "process group first (the engine's create_process_group/initialize) " + fix
        )
    head = int(engine.current_data_parallel_head())
    group = engine.context_and_model_parallel_group
    try:
        device = _device(torch, dist, group)
        tensors: list = []
        if dist.get_rank() == head:
            skeleton = _lift((list(args), dict(kwargs)), tensors, torch, device)
            message = [(skeleton, [(t.shape, t.dtype) for t in tensors])]
        else:
            message = [None]
        dist.broadcast_object_list(message, src=head, group=group)
        skeleton, specs = message[0]
        if dist.get_rank() != head:
            tensors = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in specs]
        for tensor in tensors:
            dist.broadcast(tensor, src=head, group=group)
    except Exception as exc:
        raise EngineCallError(
            f"broadcasting the arguments of {method!r} on engine {engine_name!r} from "
            f"data-parallel head rank {head} failed: {type(exc).__name__}: {exc}"
        ) from exc
    new_args, new_kwargs = _lower(skeleton, tensors)
    return list(new_args), dict(new_kwargs)
