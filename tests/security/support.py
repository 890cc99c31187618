"""Helpers for the attack tests: a second Unix user, an attacker's listener, a recorder."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import threading

import pytest

from tests.support.loopback import LoopbackServer

MALLORY = "corral-mallory"


ALICE = "corral-alice"  # an unprivileged victim, where the victim must not be root


def unix_user(name: str) -> pwd.struct_passwd:
    """A real unprivileged Unix user (created once; the tests run as root)."""
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    if os.geteuid() != 0 or not shutil.which("useradd"):
        pytest.fail("the other-user attacks need root (to create a second user with useradd)")
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/bin/sh", name],
        check=True,
        capture_output=True,
    )
    return pwd.getpwnam(name)


def mallory() -> pwd.struct_passwd:
    """The attacker: a real second, unprivileged Unix user."""
    return unix_user(MALLORY)


def as_user(name: str, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    """Run ``argv`` as user ``name`` (runuser: real uid and gid, no root)."""
    unix_user(name)
    return subprocess.run(
        ["runuser", "-u", name, "--", *argv], capture_output=True, text=True, **kwargs
    )


def as_mallory(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    """Run ``argv`` as the other user."""
    return as_user(MALLORY, argv, **kwargs)


class Listener(LoopbackServer):
    """The attacker's server: accepts connections, records every byte, answers a canned
    reply (by default an unsigned ``200``) to each request head."""

    def __init__(self, reply: bytes | None = None):
        self.reply = (
            reply
            if reply is not None
            else (
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
            )
        )
        self.received = bytearray()
        super().__init__()

    def serve(self, conn: socket.socket) -> None:
        conn.settimeout(5)
        try:
            while True:
                data = conn.recv(1 << 16)
                if not data:
                    return
                self.received += data
                if b"\r\n\r\n" in data:
                    conn.sendall(self.reply)
        except OSError:
            return
        finally:
            conn.close()


class RecordingProxy(LoopbackServer):
    """Forwards loopback TCP to ``target`` and keeps both directions' bytes."""

    def __init__(self, target: tuple[str, int]):
        self.target = target
        self.to_worker = bytearray()
        self.to_client = bytearray()
        super().__init__()

    def accepted(self, client: socket.socket) -> None:
        upstream = socket.create_connection(self.target)
        for src, dst, buf in ((client, upstream, self.to_worker),
                              (upstream, client, self.to_client)):  # fmt: skip
            threading.Thread(target=self._pipe, args=(src, dst, buf), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket, buf: bytearray) -> None:
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                buf += data
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def environ_of(pid: int) -> bytes:
    with open(f"/proc/{pid}/environ", "rb") as fh:
        return fh.read()
