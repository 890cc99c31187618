"""A forking worker's template: a process that has imported the worker and forks children.

A forked worker started as a fresh ``python -m corral.worker`` pays an interpreter start
and the worker's imports (~85 % of a fork, docs/benchmarks.md). The first fork a worker
serves starts this template instead (``python -m corral.worker.template_process``); the
template imports the worker runtime once, stays single-threaded, and makes every child of
that worker (the first included) with ``os.fork()``: a child costs a fork, its settings,
its bind and its registration.

Between the worker and its template: one ``SOCK_SEQPACKET`` socket pair (private to the
two processes; one message per datagram). The worker sends ``{"seq", "env", "secret"}``
with the child's log pipe attached; the template answers ``{"seq", "pid"}`` with the
child's pidfd attached (opened before the template can reap it, so it always names that
child), or ``{"seq", "error"}``. When a child exits, the template reaps it and sends
``{"exited", "code"}``. A reply is taken only for the request whose ``seq`` it names, and
a template that does not answer in time is stopped (its late child dies with it) and
replaced on the next fork.

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

from corral.procs import signal_group_by_pidfd

# variables read when an interpreter starts (or its libraries load): a child whose value
# differs from the template's must be a fresh process
INTERPRETER_VARS = ("PYTHON", "LD_", "MALLOC_", "GLIBC_TUNABLES")
MAX_MESSAGE = 200_000  # below the default socket buffer (net.core.wmem_default)
TEMPLATE_MODULE = "corral.worker.template_process"  # the template's side


UNKNOWN_EXIT = -1
"""The ``returncode`` of a child whose template exited first (its parent-death signal
stopped it; no parent was left to read its code)."""


def interpreter_env(env: dict[str, str]) -> dict[str, str]:
    """The variables of ``env`` that an interpreter's start reads."""
    return {k: v for k, v in env.items() if k.startswith(INTERPRETER_VARS)}


class TemplateChild:
    """A child made by the template: enough of ``Popen`` for the fork manager (``pid``,
    ``stdout``, ``returncode``, ``poll``, ``wait``). Held by a pidfd; its exit code comes
    from the template, which is its parent."""

    def __init__(self, pid: int, pidfd: int, stdout, template: Template):
        self.pid, self.stdout, self.returncode = pid, stdout, None
        self.code_unknown = False  # it ended after its template: nobody saw its exit code
        self._pidfd, self._template = pidfd, template
        self._lock = threading.Lock()  # polled by the exit watcher and by kill at once

    def poll(self) -> int | None:
        with self._lock:
            if self.returncode is None and _readable(self._pidfd, 0):
                code = self._template.exit_code(self.pid)
                self.code_unknown = code is None
                self.returncode = UNKNOWN_EXIT if code is None else code
            return self.returncode

    def kill(self) -> None:
        """SIGKILL, through the pidfd (never another process that took its pid)."""
        self.signal_group(signal.SIGKILL)

    def signal_group(self, sig: int) -> None:
        """``sig`` to the child and its process group (its session), only while the
        pidfd's process lives: the template reaps it at once, so afterwards its pid (and
        group id) may name another process."""
        if self.poll() is None:
            signal_group_by_pidfd(self._pidfd, self.pid, sig)

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
        self._replies: dict[int, tuple[dict, list[int]]] = {}
        self._seq = 0
        self._codes: dict[int, int] = {}
        self.alive = True
        threading.Thread(target=self._read, name="corral-fork-template", daemon=True).start()

    def fits(self, env: dict[str, str]) -> bool:
        """Can the template make a child with this environment?"""
        return self.alive and interpreter_env(env) == self.interpreter

    def fork(self, env: dict[str, str], secret: str, timeout: float) -> TemplateChild:
        """One child with environment ``env``; raises OSError if the template cannot."""
        read_end, write_end = os.pipe()
        try:
            with self._request_lock:
                self._seq += 1
                seq = self._seq
                message = json.dumps({"seq": seq, "env": env, "secret": secret}).encode()
                if len(message) > MAX_MESSAGE:
                    raise OSError(
                        f"fork request of {len(message)} bytes is too large for the template"
                    )
                try:
                    socket.send_fds(self._sock, [message], [write_end])
                except OSError:
                    self.alive = False  # gone before its reader saw it
                    raise
                reply, fds = self._reply(seq, timeout)
        except BaseException:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)
        if "pid" not in reply or not fds:
            os.close(read_end)
            for fd in fds:
                os.close(fd)
            raise OSError(f"the fork template could not fork: {reply.get('error', reply)}")
        return TemplateChild(reply["pid"], fds[0], os.fdopen(read_end, "rb"), self)

    def exit_code(self, pid: int, timeout: float = 5.0) -> int | None:
        """The exit code the template reports for ``pid`` (None: the template is gone)."""
        with self._state:
            self._state.wait_for(lambda: pid in self._codes or not self.alive, timeout)
            return self._codes.pop(pid, None)

    def _reply(self, seq: int, timeout: float) -> tuple[dict, list[int]]:
        """The reply to request ``seq``. A template that does not answer in time is
        stopped: a late answer (and its child) must not outlive the request."""
        with self._state:
            answered = self._state.wait_for(lambda: seq in self._replies or not self.alive, timeout)
            if answered and seq in self._replies:
                return self._replies.pop(seq)
        if not answered:
            self.stop()
            raise TimeoutError(f"the fork template did not answer within {timeout}s; stopped it")
        raise OSError("the fork template has exited")

    def _read(self) -> None:
        while True:
            try:
                data, fds, _, _ = socket.recv_fds(self._sock, MAX_MESSAGE, 4)
            except OSError:
                data, fds = b"", []
            if not data:
                break
            for fd in fds:  # recv_fds leaves them inheritable: no exec'd process gets one
                os.set_inheritable(fd, False)
            message = json.loads(data)
            with self._state:
                if "exited" in message:
                    self._codes[message["exited"]] = message["code"]
                elif self._seq == message.get("seq"):  # else a request that gave up on it
                    self._replies[message["seq"]] = (message, fds)
                else:
                    for fd in fds:
                        os.close(fd)
                self._state.notify_all()
        with self._state:
            self.alive = False
            for _, fds in self._replies.values():
                for fd in fds:
                    os.close(fd)
            self._replies.clear()
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
