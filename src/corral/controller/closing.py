"""Ending roles and the controller: ``delete_workers`` (process groups first, then the
roles in order, see corral.controller.teardown) and ``close`` (every role, then every
piece the controller holds)."""

from __future__ import annotations

from corral.controller.parts import ControllerParts


def delete_workers(c: ControllerParts, role: str | None, reverse_order: bool) -> None:
    with c.lock:
        for name in c.groups.of_roles(role):  # groups go with any role of theirs
            c.io.run(c.groups.destroy(name))
        c.stats.before_delete()  # the final table keeps the deleted roles' rows
        c.teardown.delete(role, reverse_order)
        if not c.table.roles:
            c.hold.release()
        c.caller.async_client.prune()


def close(c: ControllerParts) -> None:
    """Delete every worker and release the backend. Safe to call twice."""
    if c.closed:
        return
    try:
        delete_workers(c, None, False)
    finally:
        c.closed = True
        c.data.close()
        c.monitor.stop()
        c.caller.close()
        c.pool.shutdown(wait=False)
        c.io.close()
        c.launcher.close()
        c.hold.remove_secret()
