"""What only the etcd store promises: leases, watches, and clear failures when etcd is away."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from corral.discovery import make_name_resolve
from corral.discovery.etcd import EtcdNameResolve, parse_address
from corral.errors import ConfigError, NameResolveError

try:  # the session fixtures live with the contract suite (no conftest on purpose)
    from test_name_resolve_contract import LocalEtcd, etcd_address, etcd_server  # noqa: F401
except ImportError:  # tests/unit imported as a package
    from .test_name_resolve_contract import LocalEtcd, etcd_address, etcd_server  # noqa: F401

SRC = str(Path(__file__).resolve().parents[2] / "src")


@pytest.fixture
def make_store(etcd_address: str) -> Iterator[Callable[..., EtcdNameResolve]]:
    """Stores under a root of their own, closed after the test."""
    root = f"test-{uuid.uuid4().hex[:12]}"
    built: list[EtcdNameResolve] = []

    def make(**kwargs) -> EtcdNameResolve:
        store = EtcdNameResolve(etcd_address, root=root, **kwargs)
        built.append(store)
        return store

    yield make
    for store in built:
        store.close()


def _until(check: Callable[[], bool], within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()


# -- no etcd needed ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("etcd:2379", ("etcd", 2379)),
        ("http://10.0.0.1:23790/", ("10.0.0.1", 23790)),
        ("[::1]:2380", ("::1", 2380)),
        ("node7", ("node7", 2379)),
    ],
)
def test_parse_address(text: str, expected: tuple[str, int]) -> None:
    assert parse_address(text) == expected


@pytest.mark.parametrize("text", ["", "https://etcd:2379", "etcd:abc", "a:1,b:2", "etcd:0"])
def test_parse_address_refuses(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_address(text)


def test_factory_builds_it_and_describe_names_the_address() -> None:
    store = make_name_resolve({"type": "etcd3", "etcd3_addr": "127.0.0.1:1"})
    assert isinstance(store, EtcdNameResolve)
    assert store.describe() == {"type": "etcd3", "address": "127.0.0.1:1"}
    store.close()  # nothing was added: no lease, nothing to reach


def test_unreachable_address_fails_with_an_error_naming_it() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    store = EtcdNameResolve(f"127.0.0.1:{port}")
    for op in (
        lambda: store.get("a"),
        lambda: store.add("a", "1"),
        lambda: store.get_subtree("a"),
        lambda: store.wait("a", timeout=5),
    ):
        with pytest.raises(NameResolveError, match=f"127.0.0.1:{port} is unreachable"):
            op()
    store.close()


def test_silent_server_fails_within_the_request_timeout() -> None:
    with socket.socket() as server:  # accepts connections (backlog) but never answers
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        store = EtcdNameResolve(
            f"127.0.0.1:{server.getsockname()[1]}", connect_timeout=1, request_timeout=1
        )
        with pytest.raises(NameResolveError, match="no answer within 1s"):
            store.get("a")


# -- against a real etcd ----------------------------------------------------------------------


@pytest.mark.etcd
def test_add_if_absent_has_exactly_one_winner(make_store) -> None:
    stores = [make_store() for _ in range(8)]
    winners: list[int] = []
    barrier = threading.Barrier(len(stores))

    def race(i: int) -> None:
        barrier.wait()
        try:
            stores[i].add("race", str(i))
            winners.append(i)
        except NameResolveError:
            pass

    threads = [threading.Thread(target=race, args=(i,)) for i in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1
    assert stores[0].get("race") == str(winners[0])


@pytest.mark.etcd
def test_keep_alive_holds_entries_past_the_ttl(make_store) -> None:
    owner, reader = make_store(ttl=2), make_store()
    owner.add("alive", "1")
    time.sleep(5)
    assert reader.get("alive") == "1"


@pytest.mark.etcd
def test_close_revokes_the_lease(make_store) -> None:
    owner, reader = make_store(), make_store()
    owner.add("gone", "1")
    owner.close()
    assert reader.get("gone") is None
    with pytest.raises(NameResolveError, match="closed"):
        owner.add("again", "1")


@pytest.mark.etcd
def test_entries_of_a_killed_process_expire(etcd_address: str, make_store) -> None:
    reader = make_store()
    root = reader.describe().get("root")
    code = (
        "import sys, time\n"
        "from corral.discovery.etcd import EtcdNameResolve\n"
        f"s = EtcdNameResolve({etcd_address!r}, root={root!r}, ttl=2)\n"
        "s.add('worker/0', 'host:1234')\n"
        "print('ready', flush=True)\n"
        "time.sleep(120)\n"
    )
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    try:
        line = proc.stdout.readline()
        assert line.strip() == b"ready", proc.stderr.read().decode()
        assert reader.get("worker/0") == "host:1234"
    finally:
        proc.kill()  # no close(), no revoke: only the lease TTL can remove the entry
        proc.wait()
    killed = time.monotonic()
    assert _until(lambda: reader.get("worker/0") is None, within=8)
    assert time.monotonic() - killed > 0.5  # it expired, nobody deleted it at once


@pytest.mark.etcd
def test_stopped_keep_alive_lets_entries_expire(make_store) -> None:
    owner, reader = make_store(ttl=2), make_store()
    owner.add("stale", "1")
    owner._stop.set()  # as if the owner froze: the lease is no longer refreshed
    owner._keeper.join(timeout=5)
    assert _until(lambda: reader.get("stale") is None, within=8)


@pytest.mark.etcd
def test_lost_lease_is_replaced_and_entries_readded(etcd_address: str, make_store) -> None:
    owner, reader = make_store(ttl=2), make_store()
    owner.add("mine", "1")
    old_lease = owner._lease
    admin = EtcdNameResolve(etcd_address)
    admin._gw.call("/v3/lease/revoke", {"ID": str(old_lease)})  # etcd forgets our lease
    assert reader.get("mine") is None
    assert _until(lambda: reader.get("mine") == "1", within=6)
    assert owner._lease != old_lease
    owner.add("after", "2")  # the new lease works for new entries too
    assert reader.get("after") == "2"


@pytest.mark.etcd
def test_wait_watches_instead_of_polling(make_store, monkeypatch) -> None:
    waiter, writer = make_store(), make_store()
    reads = 0
    real_get = waiter._get

    def counting_get(full: bytes):
        nonlocal reads
        reads += 1
        return real_get(full)

    monkeypatch.setattr(waiter, "_get", counting_get)
    timer = threading.Timer(1.0, writer.add, args=("watched", "v"))
    timer.start()
    try:
        assert waiter.wait("watched", timeout=10) == "v"
    finally:
        timer.join()
    assert reads <= 2


@pytest.mark.etcd
def test_wait_does_not_return_on_other_keys_or_deletes(make_store) -> None:
    waiter, writer = make_store(), make_store()
    writer.add("target-sibling", "x")
    writer.add("target/child", "x")
    writer.delete("target-sibling")
    with pytest.raises(TimeoutError):
        waiter.wait("target", timeout=0.5)


@pytest.mark.etcd
def test_etcd_restart(etcd_server: LocalEtcd) -> None:
    address = etcd_server.start()
    store = EtcdNameResolve(address, ttl=5)
    try:
        store.add("before", "1")
        etcd_server.stop()
        for op in (
            lambda: store.get("before"),
            lambda: store.add("during", "1"),
            lambda: store.wait("during", timeout=5),
        ):
            with pytest.raises(NameResolveError, match=f"etcd at {address} is unreachable"):
                op()
        etcd_server.start()
        store.add("after", "2")
        assert store.get("after") == "2"
        # etcd keeps its data and leases across a restart, and the keep-alive resumes.
        assert store.get("before") == "1"
        time.sleep(6)
        assert store.get_subtree("after") == {}
        assert store.get("before") == "1" and store.get("after") == "2"
    finally:
        store.close()
