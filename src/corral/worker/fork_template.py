"""A forking worker's template: a process that has imported the worker and forks children.

A forked worker started as a fresh ``python -m corral.worker`` pays an interpreter start
and the worker's imports (~85 % of a fork, docs/benchmarks.md). The first fork a worker
serves starts this template instead (``python -m corral.worker.template_process``); the
template imports the worker runtime once, stays single-threaded, and makes every child of
that worker (the first included) with ``os.fork()``: a child costs a fork, its settings,
its bind and its registration.

Between the worker and its template: one ``SOCK_SEQPACKET`` socket pair (private to the
two processes; one message per datagram). The worker sends ``{"env", "secret"}`` with the
child's log pipe attached; the template answers ``{"pid"}`` with the child's pidfd attached
(opened before the template can reap it, so it always names that child), or
``{"error"}``. When a child exits, the template reaps it and sends ``{"exited", "code"}``.

Only children of corral's own worker module whose interpreter-start variables
(``INTERPRETER_VARS``) equal the template's use it; others are spawned as before."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading

# variables read when an interpreter starts (or its libraries load): a child whose value
# differs from the template's must be a fresh process
INTERPRETER_VARS = ("PYTHON", "LD_", "MALLOC_", "GLIBC_TUNABLES")
MAX_MESSAGE = 200_000  # below the default socket buffer (net.core.wmem_default)
TEMPLATE_MODULE = "corral.worker.template_process"  # the template's side


def interpreter_env(env: dict[str, str]) -> dict[str, str]:
    """The variables of ``env`` that an interpreter's start reads."""
    return {k: v for k, v in env.items() if k.startswith(INTERPRETER_VARS)}


class TemplateChild:
    """A child made by the template: enough of ``Popen`` for the fork manager (``pid``,
    ``stdout``, ``returncode``, ``poll``, ``wait``). Held by a pidfd; its exit code comes
    from the template, which is its parent."""

    def __init__(self, pid: int, pidfd: int, stdout, template: Template):
        self.pid, self.stdout, self.returncode = pid, stdout, None
        self._pidfd, self._template = pidfd, template
        self._lock = threading.Lock()  # polled by the exit watcher and by kill at once

    def poll(self) -> int | None:
        with self._lock:
            if self.returncode is None and _readable(self._pidfd, 0):
                self.returncode = self._template.exit_code(self.pid)
            return self.returncode

    def kill(self) -> None:
        """SIGKILL, through the pidfd (never another process that took its pid)."""
        if self.poll() is None:
            signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    def __del__(self) -> None:  # open until then: a waiter may be polling it
        os.close(self._pidfd)

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None and not _readable(self._pidfd, timeout):
            raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
        code = self.poll()
        return -1 if code is None else code


def _readable(fd: int, timeout: float | None) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(None if timeout is None else int(timeout * 1000)))


class Template:
    """The worker's side of its template process: started on the first fork, asked for
    each child, stopped with the worker. Requests go one at a time."""

    def __init__(self, env: dict[str, str], spawn) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            env = {**env, "CORRAL_TEMPLATE_FD": str(theirs.fileno())}
            self.proc = spawn(
                [sys.executable, "-m", TEMPLATE_MODULE], env, (theirs.fileno(),), stdout=1
            )
        except BaseException:
            mine.close()
            raise
        finally:
            theirs.close()
        self.interpreter = interpreter_env(env)
        self._sock = mine
        self._request_lock = threading.Lock()
        self._state = threading.Condition()
        self._replies: list[tuple[dict, list[int]]] = []
        self._codes: dict[int, int] = {}
        self.alive = True
        threading.Thread(target=self._read, name="corral-fork-template", daemon=True).start()

    def fits(self, env: dict[str, str]) -> bool:
        """Can the template make a child with this environment?"""
        return self.alive and interpreter_env(env) == self.interpreter

    def fork(self, env: dict[str, str], secret: str, timeout: float) -> TemplateChild:
        """One child with environment ``env``; raises OSError if the template cannot."""
        message = json.dumps({"env": env, "secret": secret}).encode()
        if len(message) > MAX_MESSAGE:
            raise OSError(f"fork request of {len(message)} bytes is too large for the template")
        read_end, write_end = os.pipe()
        try:
            with self._request_lock:
                try:
                    socket.send_fds(self._sock, [message], [write_end])
                except OSError:
                    self.alive = False  # gone before its reader saw it
                    raise
                reply, fds = self._reply(timeout)
        finally:
            os.close(write_end)
        if "pid" not in reply or not fds:
            os.close(read_end)
            for fd in fds:
                os.close(fd)
            raise OSError(f"the fork template could not fork: {reply.get('error', reply)}")
        return TemplateChild(reply["pid"], fds[0], os.fdopen(read_end, "rb"), self)

    def exit_code(self, pid: int, timeout: float = 5.0) -> int:
        """The exit code the template reports for ``pid`` (-1: the template is gone)."""
        with self._state:
            self._state.wait_for(lambda: pid in self._codes or not self.alive, timeout)
            return self._codes.pop(pid, -1)

    def _reply(self, timeout: float) -> tuple[dict, list[int]]:
        with self._state:
            if not self._state.wait_for(lambda: self._replies or not self.alive, timeout):
                raise OSError(f"the fork template did not answer within {timeout}s")
            if not self._replies:
                raise OSError("the fork template has exited")
            return self._replies.pop(0)

    def _read(self) -> None:
        while True:
            try:
                data, fds, _, _ = socket.recv_fds(self._sock, MAX_MESSAGE, 4)
            except OSError:
                data, fds = b"", []
            if not data:
                break
            message = json.loads(data)
            with self._state:
                if "exited" in message:
                    self._codes[message["exited"]] = message["code"]
                else:
                    self._replies.append((message, fds))
                self._state.notify_all()
        with self._state:
            self.alive = False
            self._state.notify_all()

    def stop(self) -> None:
        """Stop the template (its children get SIGTERM from their parent-death signal)."""
        self.alive = False
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.proc.terminate()
        try:
            self.proc.wait(3.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._sock.close()
