"""What some backends can do beyond the Launcher interface (kept small on purpose: see
tests/unit/test_launcher.py). A launcher that can, also derives from the class here; the
core asks with ``isinstance`` and says which backends can when one cannot.

- :class:`Elastic`: grow and shrink a running role (``Scheduler.scale``, corral.elastic);
- :class:`Preemptible`: roles taken away and given back by the backend (Slurm requeue,
  Ray node loss; ``Scheduler.wait_role``, corral.preemption);
- :class:`Adoptable`: workers that outlive their controller and are adopted by a new one
  (``outlive_controller``, ``attach=True``, corral.attach);
- :class:`ServesCommands`: worker commands told which port to serve on, so a foreign
  server is ready when it answers there (corral.foreign; the local backend).
- :class:`MultiNode`: workers that hold several whole nodes (corral.multinode).
"""

from __future__ import annotations

import abc

from corral.errors import ConfigError
from corral.foreign import ServedAt
from corral.launcher import LaunchRequest


class Elastic(abc.ABC):
    @abc.abstractmethod
    def grow(self, request: LaunchRequest, first: int) -> None:
        """Start replicas ``first``, ``first + 1``, ... of a running role (``request.job``
        holds just those replicas, ``request.envs`` their environments)."""

    @abc.abstractmethod
    def shrink(self, role: str, indices: list[int]) -> None:
        """Stop these replicas (the role's highest indices) and forget them."""


class Preemptible(abc.ABC):
    @abc.abstractmethod
    def preempted(self, role: str) -> bool:
        """Was the role preempted (and will come back) since ``mark_returned``?"""

    @abc.abstractmethod
    def mark_returned(self, role: str) -> None:
        """The role's workers are back after a preemption."""


class Adoptable(abc.ABC):
    @abc.abstractmethod
    def adopt(self, role: str, workers: list, log_dir: str) -> None:
        """Take over running workers of a dead controller's run."""


class MultiNode(abc.ABC):  # noqa: B024 (a declaration: the launcher places such workers)
    """The backend places a worker with ``gpu = k * n_gpus_per_node`` on k whole nodes and
    starts a member worker (role ``<role>.members``) on each node after the first, with
    the variables of corral.multinode; a dead member is reported by ``poll(role)`` as the
    instance's death, naming the member's node."""


def require(launcher: object, capability: type, what: str, field: str, value: object) -> None:
    """ConfigError naming the field, the value and the backends that can, unless the
    launcher has ``capability``."""
    if not isinstance(launcher, capability):
        raise ConfigError(
            field,
            value,
            f"the {getattr(launcher, 'name', '?')} backend cannot {what}; "
            + {
                "Elastic": "use the local, ray or slurm backend",
                "Preemptible": "use requeue=True on the slurm or ray backend",
                "Adoptable": "use 0, or the local, ray or slurm backend",
            }[capability.__name__],
        )


class ServesCommands(abc.ABC):
    @abc.abstractmethod
    def served_at(self, role: str, index: int) -> ServedAt | None:
        """Where the worker command of this replica was told to serve (``--port``), for
        the readiness probe of a foreign server; None: a corral worker that picks its
        own port and registers."""
