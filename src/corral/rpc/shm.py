"""Same-host bodies through shared memory: a frame written once into a memfd, mapped by the peer.

Why a memfd: it has no name in any file system, so nothing is left behind when either
side is killed (SIGKILL included) -- the kernel frees the pages when the last descriptor
and mapping are gone. It is created 0600, and the peer opens it through
``/proc/<pid>/fd/<n>``, which the kernel allows only to the same user (ptrace-read rule).
Both sides check the segment's random name, so a reused descriptor number is never read.

The HTTP messages still travel over the TCP connection; a body that lives in a segment is
announced by a header and the message itself has no body. A reply in a segment is held by
the server until the client acknowledges it (``ACK``/``NAK`` line on the same connection)
or the connection ends.

Who uses it: the client offers (header ``x-corral-shm-ok: <host token>``); a server on the
same host (same boot, pid namespace and host name) answers ``x-corral-shm-local`` and from then on
large requests and replies on that address go through segments. ``CORRAL_SHM=0`` turns it off.
"""

from __future__ import annotations

import functools
import mmap
import os
import threading
import time
import weakref
from collections import OrderedDict

from corral.auth import sha256
from corral.errors import ProtocolError
from corral.rpc.wire import frame_size

MIN_BYTES = 1 << 20
OFFER_HEADER = "x-corral-shm-ok"
LOCAL_HEADER = "x-corral-shm-local"
SEGMENT_HEADER = "x-corral-shm"
REFUSED_HEADER = "x-corral-shm-refused"
ACK = b"ACK /shm HTTP/1.1\r\nContent-Length: 0\r\n\r\n"
NAK = b"NAK /shm HTTP/1.1\r\nContent-Length: 0\r\n\r\n"
RELEASED_HEADER = "x-corral-shm-released"
#: every shared-memory header, in the order the request and reply signatures cover them
SIGNED_HEADERS = (SEGMENT_HEADER, OFFER_HEADER, LOCAL_HEADER, RELEASED_HEADER, REFUSED_HEADER)
_SIGNED_SET = frozenset(SIGNED_HEADERS)
_PREFIX = "corral-"
_GRAIN = 2 << 20
IDLE_SECONDS = 5.0
IDLE_MAX_BYTES = 2 << 30
MAX_BUSY = 64


@functools.cache
def host_token() -> str:
    """Same value in two processes iff one can map the other's segments ("" = unusable).

    The host name is part of it: processes that only share a kernel but call themselves
    different hosts (the nodes of a one-machine test cluster, each in its own UTS
    namespace) are treated as the different hosts they stand for, and talk over TCP."""
    if os.environ.get("CORRAL_SHM", "1") == "0" or not hasattr(os, "memfd_create"):
        return ""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            boot = fh.read().strip()
        pidns = os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""
    node = os.uname().nodename
    return sha256(f"{boot}|{pidns}|{node}".encode()).hexdigest()[:24]


def signed_headers(headers) -> str:
    """The shared-memory headers of one message as the text its signature covers (``""``
    when it has none). No header value can hold a line break (``http.parse_head`` refuses a
    bare LF or CR anywhere in a head), so no value can pass for another header's."""
    if headers.keys().isdisjoint(_SIGNED_SET):  # the common case, without a generator
        return ""
    return "\n".join(f"{n}: {headers[n]}" for n in SIGNED_HEADERS if n in headers)


class Segment:
    """A 0600 memfd of ``capacity`` bytes with the writer's own mapping (kept, so reusing
    the segment costs no page faults). Closed when this object is closed or collected.

    ``readers`` counts, per process, the mappings handed out and not yet reported gone;
    ``held`` is set while the ref store keeps the segment to hand out again."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.size = 0
        self.name = f"{_PREFIX}{os.urandom(8).hex()}"
        self.last_used = time.monotonic()
        self.readers: dict[int, int] = {}
        self.held = False
        fd = os.memfd_create(self.name, os.MFD_CLOEXEC)
        try:
            os.fchmod(fd, 0o600)
            os.ftruncate(fd, capacity)
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            self.map = mmap.mmap(fd, capacity, flags=flags)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        self._closer = weakref.finalize(self, _close, fd, self.map)

    @classmethod
    def from_parts(cls, parts: list, reader: int | None = None) -> Segment:
        """A pooled segment holding the frame ``parts``, lent to process ``reader``; with
        ``reader=None`` it is held for the ref store (``POOL.unhold`` when it is freed)."""
        size = frame_size(parts)
        seg = POOL.take(size)
        seg.write(parts, size)
        if reader is None:
            POOL.hold(seg)
        else:
            POOL.lend(seg, reader)
        return seg

    def write(self, parts: list, size: int) -> None:
        import numpy as np

        target = np.frombuffer(self.map, dtype=np.uint8)
        pos = 0
        for part in parts:
            n = part.nbytes if isinstance(part, memoryview) else len(part)
            if n:
                np.copyto(target[pos : pos + n], np.frombuffer(part, dtype=np.uint8))
            pos += n
        del target
        self.size = size

    def descriptor(self) -> str:
        return f"{os.getpid()} {self.fd} {self.size} {self.name}"

    def close(self) -> None:
        self._closer()


def _close(fd: int, mapping: mmap.mmap) -> None:
    try:
        mapping.close()
    except BufferError:  # a view of it is still alive: the mapping goes with that view
        pass
    os.close(fd)


def _alive(pid: int) -> bool:
    from corral.liveness import pid_alive

    return pid_alive(pid)


def _round_up(size: int) -> int:
    return max(_GRAIN, -(-size // _GRAIN) * _GRAIN)


class SegmentPool:
    """Warm segments of this process. A segment is written again only when the ref store
    no longer holds it and every reader said (header ``x-corral-shm-released``) that its
    mapping is gone, or died."""

    def __init__(self) -> None:
        self.idle: list[Segment] = []
        self.busy: OrderedDict[str, Segment] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, size: int) -> Segment:
        with self._lock:
            self._trim_locked(IDLE_SECONDS)
            for i, seg in enumerate(self.idle):
                if size <= seg.capacity <= 2 * _round_up(size):
                    return self.idle.pop(i)
        return Segment(_round_up(size))

    def hold(self, seg: Segment) -> None:
        with self._lock:
            seg.held = True
            self.busy[seg.name] = seg

    def unhold(self, seg: Segment) -> None:
        with self._lock:
            seg.held = False
            self._settle(seg)

    def lend(self, seg: Segment, reader: int) -> None:
        with self._lock:
            seg.last_used = time.monotonic()
            seg.readers[reader] = seg.readers.get(reader, 0) + 1
            self.busy[seg.name] = seg
            self.busy.move_to_end(seg.name)
            while len(self.busy) > MAX_BUSY:  # readers that never answered: stop tracking
                _name, old = self.busy.popitem(last=False)
                old.close()

    def returned(self, names: list[str], reader: int | None) -> None:
        """``reader`` reports its mappings of ``names`` gone."""
        with self._lock:
            for name in names:
                seg = self.busy.get(name)
                if seg is None or reader not in seg.readers:
                    continue
                seg.readers[reader] -= 1
                if seg.readers[reader] <= 0:
                    del seg.readers[reader]
                self._settle(seg)
            self._trim_locked(IDLE_SECONDS)

    def _settle(self, seg: Segment) -> None:
        if seg.held or seg.readers or self.busy.pop(seg.name, None) is None:
            return
        seg.last_used = time.monotonic()
        self.idle.append(seg)

    def trim(self, older_than: float = 0.0) -> None:
        """Close idle segments unused for ``older_than`` seconds (0: all of them)."""
        with self._lock:
            self._trim_locked(older_than)

    def _trim_locked(self, older_than: float) -> None:
        for seg in list(self.busy.values()):
            for pid in [p for p in seg.readers if not _alive(p)]:
                del seg.readers[pid]  # that reader died: it will never answer
            self._settle(seg)
        now = time.monotonic()
        keep, total = [], 0
        for seg in sorted(self.idle, key=lambda s: -s.last_used):
            if now - seg.last_used <= older_than and total + seg.capacity <= IDLE_MAX_BYTES:
                keep.append(seg)
                total += seg.capacity
            else:
                seg.close()
        self.idle = keep

    def counts(self) -> dict[str, int]:
        with self._lock:
            return {"idle": len(self.idle), "lent": len(self.busy)}


POOL = SegmentPool()
#: names of other processes' segments whose mapping here is gone, by owner pid
_RELEASED: dict[int, list[str]] = {}


def released_for(pid: int | None) -> str | None:
    """The header value telling process ``pid`` which of its segments it may reuse."""
    if pid is None:
        return None
    names = _RELEASED.pop(pid, None)
    return ",".join(names) if names else None


def has_released(pid: int) -> bool:
    """Are there segments of process ``pid`` whose mappings here are gone (to tell it)?"""
    return bool(_RELEASED.get(pid))


def take_released(value: str | None, reader: int | None) -> None:
    """Process ``reader``'s ``x-corral-shm-released`` header: its mappings are gone."""
    if value:
        POOL.returned(value.split(","), reader)


def open_private_memfd(pid: int, fd: int, name: str, size: int, error: type[Exception]) -> int:
    """A descriptor of another process's memfd, opened read-only once it is verified: the
    announced corral segment, this user's, private (0600), at least ``size`` bytes. Any
    other file raises ``error``; the caller maps it and closes the descriptor."""
    expected = f"/memfd:{name} (deleted)"
    try:
        local = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise error(f"cannot open the peer's shared memory: {exc}") from None
    try:
        if os.readlink(f"/proc/self/fd/{local}") != expected:
            raise error(f"shared-memory descriptor {pid}/{fd} names another file, not {name}")
        st = os.fstat(local)
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise error(
                f"refusing shared-memory segment {name}: it belongs to uid {st.st_uid} with "
                f"mode {st.st_mode & 0o777:o}; only this user's private (0600) segments are read"
            )
        if st.st_size < size:
            raise error(f"shared-memory segment {name} is smaller than announced")
    except BaseException:
        os.close(local)
        raise
    return local


def open_segment(descriptor: str, max_bytes: int) -> memoryview:
    """Map the peer's segment privately (copy-on-write): a writable view, zero copies.
    When the mapping is gone, the name is queued to tell the owner it may reuse it."""
    try:
        pid_s, fd_s, size_s, name = descriptor.split(" ")
        pid, fd, size = int(pid_s), int(fd_s), int(size_s)
    except ValueError:
        raise ProtocolError(f"malformed shared-memory descriptor {descriptor[:80]!r}") from None
    if not name.startswith(_PREFIX) or not 0 < size <= max_bytes or pid == os.getpid():
        raise ProtocolError(f"refusing shared-memory segment {descriptor[:80]!r}")
    local = open_private_memfd(pid, fd, name, size, ProtocolError)
    try:
        # no MAP_POPULATE: on a writable private mapping it would copy every page
        m = mmap.mmap(local, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(local)
    weakref.finalize(m, _released, pid, name).atexit = False
    return memoryview(m)


def _released(pid: int, name: str) -> None:
    _RELEASED.setdefault(pid, []).append(name)
    if NOTIFY is not None:
        NOTIFY.put(pid)  # SimpleQueue.put is safe in a finalizer (reentrant)


#: a queue.SimpleQueue that hears the owner pid of each mapping that goes away, so that a
#: process that rarely talks to that owner can tell it promptly (see data.fetch)
NOTIFY = None


def wants_segment(parts: list, local: bool) -> bool:
    """Whether a body of ``parts`` goes through shared memory (1 MiB or more, local peer)."""
    return local and frame_size(parts) >= MIN_BYTES


def in_segment(buffer) -> bool:
    """True if ``buffer`` (an array, tensor or memoryview) lies in a corral segment mapped by
    this process: it came through shared memory (tests and diagnostics)."""
    import numpy as np

    address = np.asarray(
        memoryview(buffer).cast("B") if not hasattr(buffer, "__array_interface__") else buffer
    ).__array_interface__["data"][0]
    with open("/proc/self/maps") as fh:
        for line in fh:
            span, *rest = line.split()
            start, _, end = span.partition("-")
            if int(start, 16) <= address < int(end, 16):
                return f"/memfd:{_PREFIX}" in line
    return False


def mapped_segments(pid: int | str = "self") -> int:
    """How many corral segments ``pid`` maps or holds open (leak checks in tests)."""
    count = 0
    try:
        with open(f"/proc/{pid}/maps") as fh:
            count += sum(1 for line in fh if f"/memfd:{_PREFIX}" in line)
        fd_dir = f"/proc/{pid}/fd"
        for entry in os.listdir(fd_dir):
            try:
                if os.readlink(f"{fd_dir}/{entry}").startswith(f"/memfd:{_PREFIX}"):
                    count += 1
            except OSError:
                pass
    except OSError:
        return 0
    return count
