"""Cross-role process groups: the controller's side (``Scheduler.create_process_group``,
``destroy_process_group``; groups go when a role of theirs is deleted).

Rendezvous, done by corral: the members are ordered role by role (in the order given),
by index within a role; the first member starts a ``TCPStore`` on a free port of its own
host (``/group/open``: it binds port 0 and answers the port, so nothing guesses a port for
another host); then every member joins at once (``/group/join``) and builds its process
group over a ``PrefixStore`` of that store. A member that never joins makes the others
give up after ``timeout`` seconds with a ProcessGroupError naming it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from corral.errors import ConfigError, ProcessGroupError, WorkerFailedError
from corral.groups.member import BACKENDS

#: seconds the controller waits beyond the group's timeout for the members' answers
ANSWER_MARGIN = 30.0


@dataclass(frozen=True)
class GroupInfo:
    """What ``create_process_group`` returns."""

    name: str
    backend: str
    world_size: int
    #: worker id -> rank; ranks run role by role (in the order given), by index in a role
    ranks: dict[str, int]
    roles: tuple[str, ...]
    master_addr: str
    master_port: int
    timeout: float
    members: tuple[str, ...] = field(default=())


@dataclass(frozen=True)
class GroupPorts:
    """What the group table needs from its controller, passed explicitly."""

    #: ``role -> [worker ids]`` in index order
    worker_ids: Callable[[str], list[str]]
    #: ``(worker_id, path, payload, timeout) -> awaitable reply``: a worker's route
    arequest: Callable[[str, str, Any, float | None], Awaitable[Any]]


class GroupTable:
    """The named groups of one controller."""

    def __init__(self, ports: GroupPorts):
        self.ports = ports
        self.groups: dict[str, GroupInfo] = {}
        self._lock = threading.Lock()

    def members(self, name: str, roles: Any) -> tuple[tuple[str, ...], list[str]]:
        """The roles (as given) and member ids in rank order; checks the input."""
        if not isinstance(name, str) or not name or "/" in name:
            raise ConfigError("name", name, "name the group with a non-empty string without '/'")
        if name in self.groups:
            raise ConfigError(
                "name", name, "a group of that name exists: destroy_process_group it first"
            )
        if isinstance(roles, str) or not roles:
            raise ConfigError(
                "roles", roles, 'pass a list of roles or worker ids, e.g. ["trainer/0", "rollout"]'
            )
        ids: list[str] = []
        for item in roles:
            if not isinstance(item, str):
                raise ConfigError("roles", item, "each entry is a role name or a worker id")
            role, _, index = item.rpartition("/")
            if role and index.isdigit():  # a single worker, "trainer/0"
                if item not in self.ports.worker_ids(role):
                    raise ConfigError(
                        "roles", item, f"no worker {item!r}: pick one of role {role!r}"
                    )
                found = [item]
            else:
                found = self.ports.worker_ids(item)
            for wid in found:
                if wid in ids:
                    raise ConfigError("roles", item, f"{wid} is listed twice")
                ids.append(wid)
        return tuple(roles), ids

    async def create(
        self, name: str, roles: Any, backend: str = "gloo", timeout: float = 300.0
    ) -> GroupInfo:
        if backend not in BACKENDS:
            raise ConfigError("backend", backend, f"use one of {BACKENDS}")
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise ConfigError("timeout", timeout, "pass a number of seconds > 0")
        with self._lock:
            given, ids = self.members(name, roles)
            self.groups[name] = None  # type: ignore[assignment]  # reserved while made
        try:
            info = await self._make(name, given, ids, backend, float(timeout))
        except BaseException:
            with self._lock:
                self.groups.pop(name, None)
            raise
        with self._lock:
            self.groups[name] = info
        return info

    async def _make(
        self, name: str, given: tuple, ids: list[str], backend: str, timeout: float
    ) -> GroupInfo:
        size = len(ids)
        opened = await self.ports.arequest(
            ids[0], "/group/open", {"name": name, "world_size": size, "timeout": timeout}, None
        )
        addr, port = str(opened["addr"]), int(opened["port"])

        def join(rank: int) -> Awaitable[Any]:
            body = {
                "name": name, "rank": rank, "world_size": size, "addr": addr, "port": port,
                "backend": backend, "timeout": timeout, "members": ids,
            }  # fmt: skip
            return asyncio.wait_for(
                self.ports.arequest(ids[rank], "/group/join", body, timeout + ANSWER_MARGIN),
                timeout + ANSWER_MARGIN,
            )

        tasks = [asyncio.ensure_future(join(r)) for r in range(size)]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in tasks:  # one failed: the group cannot form, stop waiting for the rest
            task.cancel()
        answers = await asyncio.gather(*tasks, return_exceptions=True)
        failed = [
            (ids[r], a)
            for r, a in enumerate(answers)
            if isinstance(a, BaseException) and not isinstance(a, asyncio.CancelledError)
        ]
        if failed:
            await self._drop(name, ids)
            raise _first_failure(name, failed)
        return GroupInfo(
            name, backend, size, {w: r for r, w in enumerate(ids)}, given, addr, port, timeout,
            tuple(ids),
        )  # fmt: skip

    async def destroy(self, name: str) -> bool:
        """Drop the group on every member still up. False if there was none."""
        with self._lock:
            info = self.groups.pop(name, None)
        if info is None:
            return False
        await self._drop(name, list(info.members))
        return True

    def of_roles(self, role: str | None) -> list[str]:
        """Names of the groups with a member in ``role`` (every group for None)."""
        return [
            name
            for name, info in self.groups.items()
            if info is not None
            and (role is None or any(m.rpartition("/")[0] == role for m in info.members))
        ]

    async def _drop(self, name: str, ids: list[str]) -> None:
        await asyncio.gather(
            *(self.ports.arequest(w, "/group/destroy", {"name": name}, 10.0) for w in ids),
            return_exceptions=True,  # a member that is gone has nothing left to drop
        )


def _first_failure(name: str, failed: list[tuple[str, BaseException]]) -> BaseException:
    """A dead member first (WorkerFailedError names it), else a member's own
    ProcessGroupError (it names those that never joined), else a timeout naming them."""
    for _wid, exc in failed:
        if isinstance(exc, WorkerFailedError):
            return exc
    for _wid, exc in failed:
        if "never joined" in str(exc):
            return ProcessGroupError(str(exc))
    late = [wid for wid, exc in failed if isinstance(exc, asyncio.TimeoutError | TimeoutError)]
    if late:
        return ProcessGroupError(
            f"process group {name!r}: {', '.join(late)} never answered its join; check "
            "that it is alive and not stuck in an engine call"
        )
    wid, exc = failed[0]
    return ProcessGroupError(f"process group {name!r}: {wid} could not join: {exc}")
