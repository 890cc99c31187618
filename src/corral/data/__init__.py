"""The data plane: results kept on workers by reference, fetched worker to worker.

``Ref`` (also ``corral.Ref``) is the handle; ``keep`` lets engine code return a ref on
purpose. See docs/data-plane.md.
"""

from __future__ import annotations

from corral.errors import RefError, RefLostError
from corral.rpc.ref import Ref


def keep(value):  # noqa: ANN001, ANN201 - re-exported lazily to keep imports cheap
    """Keep ``value`` (array or tensor) on this worker and return its ``Ref``."""
    from corral.data.store import keep as _keep

    return _keep(value)


__all__ = ["Ref", "RefError", "RefLostError", "keep"]
