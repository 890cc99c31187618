"""Shared-memory segments: private to the user, nameless, checked on open, reused only
when every reader is done. A child process plays the peer (opening our segments through
/proc needs another process)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import numpy as np
import pytest

from corral.errors import ProtocolError
from corral.rpc import shm

PEER = """
import sys
from corral.rpc import shm
view = shm.open_segment(sys.argv[1], 1 << 40)
print(bytes(view[:5]).decode(), view.readonly)
view[:5] = b"HELLO"  # the peer's own copy (copy-on-write), never the owner's
"""


def _peer(descriptor: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", PEER, descriptor], capture_output=True, text=True, timeout=60
    )


@pytest.fixture(autouse=True)
def clean_pool():
    shm.POOL.trim()
    yield
    for seg in list(shm.POOL.busy.values()):
        seg.readers.clear()
        seg.held = False
    shm.POOL.busy.clear()
    shm.POOL.trim()


def _segment(data: bytes, reader: int | None = None) -> shm.Segment:
    return shm.Segment.from_parts([data], reader)


def test_a_segment_is_a_nameless_0600_memfd():
    seg = _segment(b"hello" * 1000, reader=os.getpid())
    link = os.readlink(f"/proc/self/fd/{seg.fd}")
    assert link == f"/memfd:{seg.name} (deleted)"  # no path: nothing to leave behind
    assert stat.S_IMODE(os.fstat(seg.fd).st_mode) == 0o600
    assert not [n for n in os.listdir("/dev/shm") if n.startswith("corral")]


def test_another_process_maps_it_privately_and_writes_stay_its_own():
    seg = _segment(b"hello world", reader=os.getpid())
    done = _peer(seg.descriptor())
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["hello", "False"]  # our bytes, and writable (copy-on-write)
    view = np.frombuffer(seg.map, dtype=np.uint8)
    assert bytes(view[:5]) == b"hello"  # the peer's write did not reach us


@pytest.mark.parametrize(
    "mangle, match",
    [
        (lambda pid, fd, size, name: f"{pid} {fd} {size}", "malformed"),
        (lambda pid, fd, size, name: f"{pid} {fd} {size} evil-{name}", "refusing"),
        (lambda pid, fd, size, name: f"{pid} {fd} {size} corral-0000000000000000", "another file"),
        (lambda pid, fd, size, name: f"{pid} {fd} {size + (8 << 20)} {name}", "smaller"),
        (lambda pid, fd, size, name: f"{pid} 0 {size} {name}", "another file"),
        (lambda pid, fd, size, name: f"999999999 {fd} {size} {name}", "cannot open"),
    ],
    ids=["fields", "prefix", "renamed", "size", "other-fd", "no-process"],
)
def test_open_refuses_descriptors_that_do_not_name_the_segment(mangle, match):
    seg = _segment(b"x" * 100, reader=os.getpid())
    descriptor = mangle(os.getpid(), seg.fd, seg.size, seg.name)
    done = _peer(descriptor)
    assert done.returncode != 0
    assert "ProtocolError" in done.stderr and match in done.stderr


def test_own_segments_are_not_opened_through_proc():
    seg = _segment(b"x" * 100, reader=os.getpid())
    with pytest.raises(ProtocolError, match="refusing"):
        shm.open_segment(seg.descriptor(), 1 << 40)


def test_a_lent_segment_is_reused_only_after_its_reader_released_it():
    me = os.getpid()
    first = _segment(b"a" * 1000, reader=me)
    second = _segment(b"b" * 1000, reader=me)
    assert second.name != first.name  # the first is still lent
    shm.POOL.returned([first.name], me)
    third = _segment(b"c" * 1000, reader=me)
    assert third.name == first.name  # warm segment back in use


def test_a_held_segment_waits_for_the_store_and_every_reader():
    me = os.getpid()
    seg = _segment(b"w" * 1000)  # held for the ref store
    shm.POOL.lend(seg, me)
    shm.POOL.lend(seg, me)  # two mappings handed out
    shm.POOL.returned([seg.name], me)
    shm.POOL.unhold(seg)
    assert seg.name in shm.POOL.busy  # one mapping still out
    shm.POOL.returned([seg.name], me)
    assert seg.name not in shm.POOL.busy and seg in shm.POOL.idle


def test_segments_lent_to_a_dead_reader_are_dropped():
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    seg = _segment(b"z" * 1000, reader=dead.pid)
    fd = seg.fd
    shm.POOL.trim()
    assert seg.name not in shm.POOL.busy
    with pytest.raises(OSError):
        os.fstat(fd)  # closed


def test_released_notes_name_the_owner_and_go_once():
    shm._RELEASED.clear()
    shm._released(4242, "corral-aaaa")
    shm._released(4242, "corral-bbbb")
    assert shm.released_for(4242) == "corral-aaaa,corral-bbbb"
    assert shm.released_for(4242) is None
    assert shm.released_for(None) is None


def test_host_token_is_stable_and_can_be_switched_off(monkeypatch):
    assert shm.host_token() == shm.host_token() != ""
    code = "from corral.rpc import shm; print(repr(shm.host_token()))"
    env = {**os.environ, "CORRAL_SHM": "0"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "''"
