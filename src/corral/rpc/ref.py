"""``corral.Ref``: a handle to an array or tensor that stays on the worker that made it.

A ref names its owner (``role/index`` and the owner's process generation), a random key,
and what the value is (dtype, shape, nbytes). It is small on the wire, so passing it to
another worker's call costs nothing; that worker fetches the bytes straight from the owner.

In the controller, every ref that arrives in a result is adopted by the scheduler's data
plane (found by trial name), which frees it on the owner once the last copy is dropped.

It lives in ``rpc`` because the wire encodes it (``rpc.wire``); the data plane above
(``corral.data``) registers in ``PLANES`` and does the fetching and freeing.
"""

from __future__ import annotations

import weakref

from corral.errors import ProtocolError, RefError

TYPE_CHECKING = False  # typing's, without importing typing (a worker's start)
if TYPE_CHECKING:
    from typing import Any

WIRE_TAG = "ref"
_FIELDS = ("owner", "key", "dtype", "shape", "nbytes", "generation", "trial", "kind")
#: data planes of the schedulers in this process, by ``experiment/trial``
PLANES: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()


class Ref:
    """A value kept by worker ``owner``; ``to_local()`` fetches it, ``free()`` drops it."""

    __slots__ = (*_FIELDS, "freed", "__weakref__")

    def __init__(
        self,
        owner: str,
        key: str,
        dtype: str,
        shape: tuple[int, ...],
        nbytes: int,
        generation: str,
        trial: str,
        kind: str = "nd",
    ):
        self.owner = owner
        self.key = key
        self.dtype = dtype
        self.shape = tuple(shape)
        self.nbytes = nbytes
        self.generation = generation
        self.trial = trial
        self.kind = kind  # "nd" numpy array, "pt" torch tensor
        self.freed = False

    @property
    def ident(self) -> tuple[str, str, str]:
        return (self.owner, self.generation, self.key)

    def to_local(self, timeout: float | None = None) -> Any:
        """The value, fetched from its owner (the ref stays valid)."""
        return _plane(self).fetch([self], timeout)[0]

    async def ato_local(self, timeout: float | None = None) -> Any:
        """``to_local`` for asyncio code."""
        return (await _plane(self).afetch([self], timeout))[0]

    def free(self) -> None:
        """Drop the value on its owner now. Using this ref (or a copy of it) later raises."""
        if not self.freed:
            self.freed = True
            _plane(self).free(self)

    def check_usable(self) -> None:
        if self.freed:
            raise RefError(
                f"{self!r} was freed with ref.free(); keep the ref (and do not free it) until "
                "every call that reads it has returned"
            )

    def __repr__(self) -> str:
        shape = "x".join(map(str, self.shape)) or "scalar"
        return f"Ref({self.owner}:{self.key[:8]} {self.dtype}[{shape}] {self.nbytes} B)"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Ref) and (self.trial, *self.ident) == (other.trial, *other.ident)

    def __hash__(self) -> int:
        return hash((self.trial, *self.ident))

    def __copy__(self) -> Ref:
        return self

    def __deepcopy__(self, memo: dict) -> Ref:
        return self

    def __reduce__(self):
        return (Ref, tuple(getattr(self, f) for f in _FIELDS))

    # wire ---------------------------------------------------------------------
    def to_wire(self) -> dict:
        self.check_usable()
        return {"$t": WIRE_TAG, **{f: getattr(self, f) for f in _FIELDS}}

    @classmethod
    def from_wire(cls, node: dict) -> Ref:
        try:
            values = {f: node[f] for f in _FIELDS}
        except KeyError as exc:
            raise ProtocolError(f"ref on the wire lacks field {exc}") from None
        strings = ("owner", "key", "dtype", "generation", "trial", "kind")
        if not all(isinstance(values[f], str) for f in strings):
            raise ProtocolError("ref fields owner/key/dtype/generation/trial/kind must be strings")
        shape, nbytes = values["shape"], values["nbytes"]
        if not isinstance(shape, list) or not all(
            isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in shape
        ):
            raise ProtocolError(f"bad ref shape {shape!r}")
        if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 0:
            raise ProtocolError(f"bad ref nbytes {nbytes!r}")
        ref = cls(**values)
        plane = PLANES.get(ref.trial)
        if plane is not None:
            plane.adopt(ref)
        return ref


def _plane(ref: Ref) -> Any:
    plane = PLANES.get(ref.trial)
    if plane is None:
        raise RefError(
            f"{ref!r} belongs to trial {ref.trial!r}, which has no open scheduler in this "
            "process: fetch it in the controller that made it, or pass it to a call of a "
            "worker of that trial"
        )
    return plane
