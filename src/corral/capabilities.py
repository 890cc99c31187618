"""What some backends can do beyond the Launcher interface (kept small on purpose: see
tests/unit/test_launcher.py). A launcher that can holds a *part* that does it, an object
of one of these classes, in the attribute named below (``None``: it cannot); the core
asks for the part with :func:`require` and says which backends can when one cannot.

- ``launcher.elastic``, ``launcher.preemption``, ``launcher.adoption``, ``launcher.commands``;
- ``launcher.multi_node``: a bool (a declaration, nothing to call).

- :class:`Elastic`: grow and shrink a running role (``Scheduler.scale``, corral.controller.elastic);
- :class:`Preemptible`: roles taken away and given back by the backend (Slurm requeue,
  Ray node loss; ``Scheduler.wait_role``, corral.controller.preemption);
- :class:`Adoptable`: workers that outlive their controller and are adopted by a new one
  (``outlive_controller``, ``attach=True``, corral.controller.adoption);
- :class:`ServesCommands`: worker commands told which port to serve on, so a foreign
  server is ready when it answers there (corral.foreign; the local backend).
- ``multi_node``: workers that hold several whole nodes (corral.multinode).
"""

from __future__ import annotations

import abc
from typing import Any

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


MULTI_NODE = """``launcher.multi_node = True``: the backend places a worker with
``gpu = k * n_gpus_per_node`` on k whole nodes and starts a member worker (role
``<role>.members``) on each node after the first, with the variables of corral.multinode;
a dead member is reported by ``poll(role)`` as the instance's death, naming its node."""

_WHO_CAN = {
    "elastic": "use the local, ray or slurm backend",
    "preemption": "use requeue=True on the slurm or ray backend",
    "adoption": "use 0, or the local, ray or slurm backend",
}


def require(launcher: Any, part: str, what: str, field: str, value: object) -> Any:
    """The launcher's ``part`` (``"elastic"``, ``"preemption"``, ``"adoption"``); a
    ConfigError naming the field, the value and the backends that can when it has none."""
    got = getattr(launcher, part, None)
    if got is None:
        raise ConfigError(
            field,
            value,
            f"the {getattr(launcher, 'name', '?')} backend cannot {what}; {_WHO_CAN[part]}",
        )
    return got


class ServesCommands(abc.ABC):
    @abc.abstractmethod
    def served_at(self, role: str, index: int) -> ServedAt | None:
        """Where the worker command of this replica was told to serve (``--port``), for
        the readiness probe of a foreign server; None: a corral worker that picks its
        own port and registers."""
