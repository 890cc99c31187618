"""The worker's controller watch: it exits on a stale, removed or orphaned lease, and only
then. Runs the real ``ControllerWatch`` against an in-memory name-resolve."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from corral import name_resolve_keys
from corral.discovery.memory import MemoryNameResolve
from corral.worker.runtime import ControllerWatch

LEASE = 1.0


def _runtime(
    controller_pid: int | None = None, controller_host: str | None = None, lease: float = LEASE
):
    settings = SimpleNamespace(
        experiment="exp",
        trial="t",
        lease_timeout=lease,
        controller_pid=controller_pid,
        controller_host=controller_host,
    )
    return SimpleNamespace(
        settings=settings, name_resolve=MemoryNameResolve(), stopped=threading.Event()
    )


class _Watch:
    """Runs the watch in a thread; ``lost`` holds why it gave up (empty while it has not)."""

    def __init__(self, runtime):
        self.runtime = runtime
        self.lost: list[str] = []
        self.done = threading.Event()
        self.key = name_resolve_keys.controller_key("exp", "t")

        def on_lost(why: str) -> None:
            self.lost.append(why)
            self.done.set()

        self.thread = threading.Thread(target=ControllerWatch(runtime, on_lost).run, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.runtime.stopped.set()
        self.thread.join(5)

    def beat(self, n: int) -> None:
        self.runtime.name_resolve.add(self.key, f"beat {n}", replace=True)


def test_a_lease_that_stops_changing_is_lost_after_the_timeout():
    rt = _runtime()
    with _Watch(rt) as watch:
        watch.beat(0)  # present but never renewed: a frozen controller
        assert watch.done.wait(LEASE * 10), "a frozen lease was never noticed"
    assert watch.lost == [f"controller lease not renewed for {LEASE:.0f}s"]


def test_a_renewed_lease_is_kept_and_lost_once_renewal_stops():
    """Renewed every 0.6 s (slower than the watch's 0.5 s poll, so it often reads the same
    value twice) for two lease timeouts of 2 s: staleness counts from the last change."""
    rt = _runtime(lease=2.0)
    with _Watch(rt) as watch:
        for n in range(7):
            watch.beat(n)
            assert not watch.done.wait(0.6), f"lost while renewed: {watch.lost}"
        assert watch.done.wait(20), "a lease no longer renewed was never noticed"
    assert watch.lost == ["controller lease not renewed for 2s"]


def test_a_removed_lease_is_lost():
    rt = _runtime()
    with _Watch(rt) as watch:
        watch.beat(0)
        assert not watch.done.wait(0.6)
        rt.name_resolve.delete(watch.key)
        assert watch.done.wait(LEASE * 10)
    assert watch.lost == ["controller lease removed"]


def test_a_lease_taken_by_another_run_is_lost_at_once():
    rt = _runtime(lease=600)
    rt.settings.run_id = "oldrun"
    with _Watch(rt) as watch:
        rt.name_resolve.add(watch.key, '{"run_id": "oldrun", "n": 0}', replace=True)
        assert not watch.done.wait(1.5)  # its own run's lease: kept
        rt.name_resolve.add(watch.key, '{"run_id": "newrun", "n": 0}', replace=True)
        assert watch.done.wait(10), "a lease of another run was never noticed"
    assert "belongs to run newrun" in watch.lost[0]


def test_a_lease_that_cannot_be_read_counts_as_stale_and_is_lost():
    """The store is down or the lease is signed with another secret: every read raises.
    A worker used to retry forever (and outlived its controller for hours)."""

    class Down(MemoryNameResolve):
        def get(self, key):
            raise ConnectionRefusedError("name-resolve store is down")

    rt = _runtime()
    rt.name_resolve = Down()
    with _Watch(rt) as watch:
        assert watch.done.wait(LEASE * 10), "an unreadable lease was never given up on"
    assert watch.lost[0].startswith(f"controller lease unreadable for {LEASE:.0f}s")
    assert "name-resolve store is down" in watch.lost[0]
