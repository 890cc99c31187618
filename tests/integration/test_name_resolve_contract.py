"""One contract, every name-resolve store: memory, files and (marked ``etcd``) a real etcd.

The etcd store needs an etcd server: ``CORRAL_ETCD_ADDR=host:port`` names one; otherwise a
throw-away one is started with ``.ci/etcd.sh start`` for the session and stopped at its end.
If that is impossible the etcd cases skip, or fail when the ``CI`` environment variable is set.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from corral.discovery import make_name_resolve
from corral.discovery.files import FileNameResolve
from corral.discovery.memory import MemoryNameResolve
from corral.errors import ConfigError, NameResolveError

ETCD_SCRIPT = Path(__file__).resolve().parents[2] / ".ci" / "etcd.sh"


def etcd_unavailable(reason: str) -> None:
    """Skip (locally) or fail (in CI) a test that needs etcd."""
    if os.environ.get("CI"):
        pytest.fail(f"etcd is required in CI but {reason}", pytrace=False)
    pytest.skip(f"no etcd: {reason} (run .ci/etcd.sh install, or set CORRAL_ETCD_ADDR)")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LocalEtcd:
    """An etcd started and stopped through .ci/etcd.sh, with its own ports and data dir."""

    def __init__(self, directory: Path):
        self.env = {
            **os.environ,
            "CORRAL_ETCD_DIR": str(directory),
            "CORRAL_ETCD_CLIENT_PORT": str(_free_port()),
            "CORRAL_ETCD_PEER_PORT": str(_free_port()),
        }
        self.address = f"127.0.0.1:{self.env['CORRAL_ETCD_CLIENT_PORT']}"
        self.started = False

    def _script(self, command: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", str(ETCD_SCRIPT), command],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def start(self) -> str:
        """Start etcd (skipping/failing the test if it cannot); return its address."""
        if shutil.which("etcd") is None:
            etcd_unavailable("the etcd binary is not installed")
        done = self._script("start")
        if done.returncode != 0:
            etcd_unavailable(f".ci/etcd.sh start failed:\n{done.stdout}{done.stderr}")
        self.started = True
        return self.address

    def stop(self) -> None:
        """Stop it by its PID file (a no-op if this object never started it)."""
        if not self.started:
            return
        done = self._script("stop")
        assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="session")
def etcd_address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """host:port of an etcd for the whole session.

    Test modules that import this fixture get their own instance of it; the first one started
    publishes its etcd in CORRAL_ETCD_ADDR, so the others reuse it and only the first stops it.
    """
    address = os.environ.get("CORRAL_ETCD_ADDR")
    if address:
        yield address
        return
    server = LocalEtcd(tmp_path_factory.mktemp("etcd"))
    os.environ["CORRAL_ETCD_ADDR"] = server.start()
    try:
        yield server.address
    finally:
        os.environ.pop("CORRAL_ETCD_ADDR", None)
        server.stop()


@pytest.fixture
def etcd_server(tmp_path: Path) -> Iterator[LocalEtcd]:
    """A private etcd that a test may stop and restart; stopped after the test."""
    server = LocalEtcd(tmp_path / "etcd")
    yield server
    server.stop()


def _etcd_store(address: str, prefix: str) -> Callable[[], object]:
    from corral.discovery.etcd import EtcdNameResolve

    # Default root, so that describe() round-trips through make_name_resolve.
    def build() -> EtcdNameResolve:
        return EtcdNameResolve(address)

    cleaner = build()
    cleaner.clear_subtree(prefix)
    cleaner.close()
    return build


P = "contract"  # every key of these tests lives below this prefix


@pytest.fixture(params=["memory", "files", pytest.param("etcd", marks=pytest.mark.etcd)])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable]:
    """A factory of stores that share one namespace (two processes' views of one store)."""
    built: list = []
    if request.param == "memory":
        shared = MemoryNameResolve()
        factory: Callable = lambda: shared  # noqa: E731
    elif request.param == "files":
        factory = lambda: FileNameResolve(str(tmp_path / "nr"))  # noqa: E731
    else:
        factory = _etcd_store(request.getfixturevalue("etcd_address"), P)

    def make():
        store = factory()
        built.append(store)
        return store

    yield make
    for store in built:
        store.clear_subtree(P)
        store.close()


@pytest.fixture
def store(make_store: Callable):
    return make_store()


def test_add_then_get(store) -> None:
    assert store.get(f"{P}/missing") is None
    store.add(f"{P}/a", "1")
    assert store.get(f"{P}/a") == "1"
    store.add(f"{P}/empty", "")
    assert store.get(f"{P}/empty") == ""


def test_second_add_is_refused(make_store) -> None:
    first, second = make_store(), make_store()
    first.add(f"{P}/a", "1")
    with pytest.raises(NameResolveError, match="already exists"):
        second.add(f"{P}/a", "2")
    assert first.get(f"{P}/a") == "1"


def test_replace_overwrites(make_store) -> None:
    first, second = make_store(), make_store()
    first.add(f"{P}/a", "1")
    second.add(f"{P}/a", "2", replace=True)
    assert first.get(f"{P}/a") == "2"
    first.add(f"{P}/new", "3", replace=True)
    assert second.get(f"{P}/new") == "3"


def test_get_subtree_returns_only_keys_below_prefix(store) -> None:
    for key, value in {"job": "0", "job/a": "1", "job/b/c": "2", "jobx/d": "3", "o/e": "4"}.items():
        store.add(f"{P}/{key}", value)
    assert store.get_subtree(f"{P}/job") == {f"{P}/job/a": "1", f"{P}/job/b/c": "2"}
    assert store.get_subtree(f"{P}/nothing") == {}


def test_delete(store) -> None:
    store.add(f"{P}/a", "1")
    store.add(f"{P}/a/b", "2")
    store.delete(f"{P}/a")
    assert store.get(f"{P}/a") is None
    assert store.get(f"{P}/a/b") == "2"
    store.delete(f"{P}/a")  # absent: no error
    store.add(f"{P}/a", "3")  # and it may be added again
    assert store.get(f"{P}/a") == "3"


def test_clear_subtree(store) -> None:
    for key in ("job", "job/a", "job/b/c", "jobx/d"):
        store.add(f"{P}/{key}", key)
    store.clear_subtree(f"{P}/job")
    assert store.get(f"{P}/job") is None
    assert store.get_subtree(f"{P}/job") == {}
    assert store.get(f"{P}/jobx/d") == "jobx/d"
    store.clear_subtree(f"{P}/job")  # absent: no error


def test_wait_returns_existing_value(store) -> None:
    store.add(f"{P}/a", "1")
    assert store.wait(f"{P}/a", timeout=1) == "1"


def test_wait_returns_once_another_thread_adds(make_store) -> None:
    waiter, writer = make_store(), make_store()
    timer = threading.Timer(0.3, writer.add, args=(f"{P}/late", "here"))
    timer.start()
    try:
        assert waiter.wait(f"{P}/late", timeout=10) == "here"
    finally:
        timer.join()


def test_wait_times_out(store) -> None:
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        store.wait(f"{P}/never", timeout=0.5)
    assert time.monotonic() - started >= 0.5  # it waited the whole timeout


BAD_KEYS = ["", "/a", f"{P}/../x", f"{P}//x", f"{P}/", "..", f"{P}/./x"]


@pytest.mark.parametrize("key", BAD_KEYS)
def test_bad_keys_are_refused(store, key: str) -> None:
    with pytest.raises(ConfigError):
        store.add(key, "v")
    with pytest.raises(ConfigError):
        store.get(key)
    with pytest.raises(ConfigError):
        store.get_subtree(key)
    with pytest.raises(ConfigError):
        store.delete(key)
    with pytest.raises(ConfigError):
        store.clear_subtree(key)


@pytest.mark.parametrize("key", BAD_KEYS)
def test_wait_refuses_bad_keys(store, key: str) -> None:
    with pytest.raises(ConfigError):
        store.wait(key, timeout=0.1)


def test_describe_rebuilds_a_view_of_the_same_store(store) -> None:
    if isinstance(store, MemoryNameResolve):
        with pytest.raises(NameResolveError):
            store.describe()
        return
    store.add(f"{P}/shared", "yes")
    other = make_name_resolve(store.describe())
    try:
        assert type(other) is type(store)
        assert other.get(f"{P}/shared") == "yes"
    finally:
        other.close()
