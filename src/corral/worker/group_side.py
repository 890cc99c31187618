"""The worker's side of cross-role process groups (``corral.groups``), made on first use:
a worker that never joins a group never imports torch or the group code."""

from __future__ import annotations


class LazyGroupMember:
    """The ``/group/*`` routes of one worker; the ``GroupMember`` is made by the first one."""

    def __init__(self, worker_id: str, host: str):
        self._args = (worker_id, host)
        self._member = None

    def _get(self):
        if self._member is None:
            from corral.groups.member import GroupMember

            self._member = GroupMember(*self._args)
        return self._member

    def open(self, p: dict) -> dict:
        return self._get().open(p)

    def join(self, p: dict) -> dict:
        return self._get().join(p)

    def destroy(self, p: dict) -> bool:
        return self._get().destroy(p)

    def destroy_all(self) -> None:
        if self._member is not None:
            self._member.destroy_all()
