"""Same-host bodies in shared memory: as tamper-proof as the socket path.

The socket path signs a digest of every body. A body in a shared-memory segment is named
by a signed descriptor instead, and its bytes are not hashed (that would cost what shared
memory saves). That is as safe only if nobody outside the trust boundary (the user's own
processes, root) can write a segment, and a reader maps nothing else. These tests try it
as a real second user, ``corral-mallory``, against a segment written by corral's own code
in a process of an unprivileged victim user, ``corral-alice``; and they prove that the
shared-memory headers themselves are covered by the request and reply signatures.
"""

from __future__ import annotations

import asyncio
import ctypes
import hashlib
import json
import os
import socket
import subprocess
import sys

import numpy  # noqa: F401  (loaded here: the victim, forked from this process, writes with it)
import pytest

from corral import Job
from corral.auth import AUTH_HEADER, RequestSigner, TrialKeys
from corral.errors import AuthenticationError, ProtocolError
from corral.rpc import shm, wire
from corral.rpc.client import new_request_id
from corral.rpc.http import (
    FRAME_TYPE,
    IDENTITY_HEADER,
    REQUEST_ID_HEADER,
    SocketReader,
    send_message,
)
from tests.security.support import ALICE, MALLORY, as_user, mallory, unix_user

ECHO = "corral.testing.engines.EchoEngine"
SYSTEM_PYTHON = "/usr/bin/python3"  # readable by every user (the test's own may not be)
PR_SET_DUMPABLE = 4

# Run by the attacker (any user) with the system Python: every way into another process's
# memfd that the kernel offers, each reported as "ok" or the errno name.
ATTACK = r"""
import errno, json, os, sys
pid, fd, start, end, addr = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
out = {}
def attempt(name, fn):
    try:
        fn()
        out[name] = "ok"
    except OSError as exc:
        out[name] = errno.errorcode.get(exc.errno, str(exc.errno))
def write_fd():
    f = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR)
    try:
        os.pwrite(f, b"EVIL", 0)
    finally:
        os.close(f)
def read_fd():
    os.close(os.open(f"/proc/{pid}/fd/{fd}", os.O_RDONLY))
def write_map_file():
    f = os.open(f"/proc/{pid}/map_files/{start}-{end}", os.O_RDWR)
    try:
        os.pwrite(f, b"EVIL", 0)
    finally:
        os.close(f)
def write_mem():
    f = os.open(f"/proc/{pid}/mem", os.O_RDWR)
    try:
        os.pwrite(f, b"EVIL", addr)
    finally:
        os.close(f)
for name, fn in (("write_fd", write_fd), ("read_fd", read_fd),
                 ("write_map_file", write_map_file), ("write_mem", write_mem)):
    attempt(name, fn)
print(json.dumps(out))
"""

# Run by a user to offer a segment of its own: a memfd named like corral's, holding
# argv[2], with mode argv[1]; prints "pid fd size name" and lives until stdin closes.
OWN_SEGMENT = r"""
import os, secrets, sys
name = "corral-" + secrets.token_hex(8)
data = sys.argv[2].encode() * 4096
fd = os.memfd_create(name, 0)
os.fchmod(fd, int(sys.argv[1], 8))
os.write(fd, data)
print(os.getpid(), fd, len(data), name, flush=True)
sys.stdin.read()
"""


class Victim:
    """A process of the unprivileged user ``corral-alice`` holding a segment that corral's
    ``shm.Segment`` wrote, as a controller does for a large request body.

    Forked from the test (so it runs corral's code without needing the test's Python) and
    then made alice. A process that changed its uid is made non-dumpable by the kernel,
    which would hide its /proc files from *everyone*; a real worker is started by exec and
    is dumpable, so the victim makes itself dumpable again to be attacked as a worker is."""

    def __init__(self, payload: bytes):
        user = unix_user(ALICE)
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # pragma: no cover - the child
            code = 1
            try:
                os.close(self._to_child)
                os.close(self._from_child)
                os.setgroups([])
                os.setgid(user.pw_gid)
                os.setuid(user.pw_uid)
                ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
                seg = shm.Segment.from_parts([payload], os.getppid())
                addr = ctypes.addressof(ctypes.c_char.from_buffer(seg.map))
                with open("/proc/self/maps") as fh:
                    span = next(line.split()[0] for line in fh if seg.name in line)
                start, end = span.split("-")
                info = {"fd": seg.fd, "size": seg.size, "name": seg.name, "start": start,
                        "end": end, "addr": addr}  # fmt: skip
                os.write(from_child_w, json.dumps(info).encode() + b"\n")
                with os.fdopen(to_child_r, "rb") as commands:
                    for line in commands:
                        if line.strip() == b"digest":
                            digest = hashlib.sha256(seg.map[: seg.size]).hexdigest()
                            os.write(from_child_w, digest.encode() + b"\n")
                code = 0
            except BaseException:
                import traceback

                traceback.print_exc()
            finally:
                os._exit(code)
        os.close(to_child_r)
        os.close(from_child_w)
        self._reader = os.fdopen(self._from_child, "rb")
        self.info = json.loads(self._reader.readline())

    def digest(self) -> str:
        os.write(self._to_child, b"digest\n")
        return self._reader.readline().decode().strip()

    def attack_as(self, user: str) -> dict[str, str]:
        i = self.info
        argv = [str(self.pid), str(i["fd"]), i["start"], i["end"], str(i["addr"])]
        done = as_user(user, [SYSTEM_PYTHON, "-c", ATTACK, *argv], timeout=60)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def close(self) -> None:
        os.close(self._to_child)
        self._reader.close()
        os.waitpid(self.pid, 0)


@pytest.fixture
def victim():
    payload = bytes(range(256)) * (8 * 1024)  # 2 MiB: over shm.MIN_BYTES
    v = Victim(payload)
    yield v, hashlib.sha256(payload).hexdigest()
    v.close()


def test_another_user_can_neither_read_nor_write_a_live_segment(victim) -> None:
    v, original = victim
    alice = unix_user(ALICE)
    st = os.stat(f"/proc/{v.pid}/fd/{v.info['fd']}")  # root looks: alice's private memfd
    assert (st.st_uid, st.st_mode & 0o777) == (alice.pw_uid, 0o600)
    assert v.digest() == original

    mallory()
    tried = v.attack_as(MALLORY)
    assert tried == {
        "write_fd": "EACCES",
        "read_fd": "EACCES",
        "write_map_file": "EACCES",
        "write_mem": "EACCES",
    }, tried
    assert v.digest() == original, "the other user changed the segment"

    # control: the same attack by another process of the victim's own user (inside the
    # trust boundary: it could read the secret file too) does reach the bytes, so the
    # refusals above come from the user boundary, not from a wrong path
    control = v.attack_as(ALICE)
    assert control["write_fd"] == "ok", control
    assert v.digest() != original


@pytest.mark.parametrize("owner", ["another user", "this user, mode 0644"])
def test_reader_refuses_a_segment_that_is_not_this_users_private_memfd(owner) -> None:
    """A descriptor naming a memfd of another user (which root, or a pid reused by the
    other user, could reach) or a memfd others may write is not mapped."""
    if owner == "another user":
        argv = ["runuser", "-u", MALLORY, "--", SYSTEM_PYTHON, "-c", OWN_SEGMENT, "600", "evil"]
        mallory()
    else:
        argv = [sys.executable, "-c", OWN_SEGMENT, "644", "evil"]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        descriptor = proc.stdout.readline().strip()
        assert descriptor.count(" ") == 3, descriptor
        pid, fd, _size, _name = descriptor.split(" ")
        # the test runs as root, whom the kernel lets open any process's fds: the only
        # thing between this reader and the foreign bytes is the reader's own check
        local = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDONLY)
        assert os.pread(local, 4, 0) == b"evil"
        os.close(local)
        with pytest.raises(ProtocolError, match="only this user's private"):
            shm.open_segment(descriptor, 1 << 30)
    finally:
        proc.stdin.close()
        proc.wait(10)


# ------------------------------------------------------------- signed headers
def _call(worker, secret: str, extra: dict[str, str], tamper=None, value="x"):
    """One signed /call of ``echo(value)``, built by hand with the shared-memory headers
    ``extra``; ``tamper(headers)`` changes the head after it was signed. (reply, nonce)."""
    body = b"".join(bytes(p) for p in wire.encode({"engine_name": "e", "method": "echo",
                                                   "args": [value]}))  # fmt: skip
    request_id = new_request_id()
    headers = {"Host": "corral", REQUEST_ID_HEADER: request_id, "Content-Type": FRAME_TYPE,
               IDENTITY_HEADER: worker.identity, **extra}  # fmt: skip
    signer = RequestSigner(TrialKeys(secret))
    auth, nonce = signer.sign("POST", "/call", request_id, worker.identity, [body], len(body),
                              shm.signed_headers(headers))  # fmt: skip
    headers[AUTH_HEADER] = auth
    if tamper is not None:
        tamper(headers)
    with socket.create_connection((worker.ip, worker.port), timeout=10) as sock:
        send_message(sock, "POST /call HTTP/1.1", headers, [body])
        reader = SocketReader(sock)
        reply = reader.read_head()
        reply.body = reader.read_body(reply.content_length)
    return reply, nonce, signer


def test_shared_memory_headers_are_covered_by_the_signatures(sched) -> None:
    (wid,) = sched.create_workers(Job(role="shmhdr", replicas=1))
    asyncio.run(sched.create_engine(wid, ECHO, "e"))
    worker = sched.get_workers("shmhdr")[0]
    offer = {shm.OFFER_HEADER: f"{shm.host_token()} {os.getpid()}"}
    assert shm.host_token(), "shared memory is off on this host: nothing to test"

    # request side: an altered, added or dropped shared-memory header breaks the signature
    tampers = {
        "offer pid changed": lambda h: h.update({shm.OFFER_HEADER: f"{shm.host_token()} 1"}),
        "offer dropped": lambda h: h.pop(shm.OFFER_HEADER),
        "released added": lambda h: h.update({shm.RELEASED_HEADER: "corral-00000000000000"}),
        "segment added": lambda h: h.update({shm.SEGMENT_HEADER: "1 3 2097152 corral-0"}),
    }
    for what, tamper in tampers.items():
        reply, _nonce, _signer = _call(worker, sched.secret, offer, tamper)
        assert reply.status == 401 and b"wrong signature" in bytes(reply.body), what

    # untouched, the same request runs (once) and its reply carries the signed answer
    reply, nonce, signer = _call(worker, sched.secret, offer)
    assert reply.status == 200, bytes(reply.body)
    if sched.backend in ("local", "ray"):  # Slurm lab nodes have host names of their own
        assert shm.LOCAL_HEADER in reply.headers  # the worker says it shares this host

    def verify(headers):
        return signer.verify_reply_head(
            worker.address, headers.get(AUTH_HEADER), reply.status, nonce,
            headers.get("content-type", ""), reply.content_length, shm.signed_headers(headers),
        )  # fmt: skip

    assert verify(reply.headers)
    altered = {
        "local pid changed or added": {**reply.headers, shm.LOCAL_HEADER: "1"},
        "released added": {**reply.headers, shm.RELEASED_HEADER: "corral-0000000000000000"},
        "refused added": {**reply.headers, shm.REFUSED_HEADER: "1"},
    }
    for what, headers in altered.items():
        with pytest.raises(AuthenticationError, match="wrong signature"):
            verify(headers)
        assert what
    assert sched.call_engine(wid, "count", "e") == 1  # the tampered requests never ran


def test_an_offer_from_another_host_is_never_taken_as_same_host(sched) -> None:
    """A shared-memory offer carries the client's host token; one from another host (a
    token that is not the worker's) gets a reply over the socket: no same-host answer, and
    a large reply comes as bytes in the body, not as a segment it could not map."""
    (wid,) = sched.create_workers(Job(role="shmfar", replicas=1))
    asyncio.run(sched.create_engine(wid, ECHO, "e"))
    worker = sched.get_workers("shmfar")[0]
    assert shm.host_token(), "shared memory is off on this host: nothing to test"
    foreign = hashlib.sha256(b"another boot, another host").hexdigest()[:24]
    assert foreign != shm.host_token()
    big = numpy.arange(1 << 20, dtype=numpy.float32)  # 4 MiB: would go through shared memory
    reply, _nonce, _signer = _call(
        worker, sched.secret, {shm.OFFER_HEADER: f"{foreign} {os.getpid()}"}, value=big
    )
    assert reply.status == 200, bytes(reply.body)
    assert shm.LOCAL_HEADER not in reply.headers and shm.SEGMENT_HEADER not in reply.headers
    assert numpy.array_equal(wire.decode(reply.body)["result"], big)
    if sched.backend in ("local", "ray"):  # the same offer with this host's token is taken
        mine = {shm.OFFER_HEADER: f"{shm.host_token()} {os.getpid()}"}
        reply, _nonce, _signer = _call(worker, sched.secret, mine)
        assert reply.status == 200 and shm.LOCAL_HEADER in reply.headers
