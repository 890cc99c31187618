"""A forking worker's template: a process that has imported the worker and forks children.

A forked worker started as a fresh ``python -m corral.worker`` pays an interpreter start
and the worker's imports (~85 % of a fork, docs/benchmarks.md). The first fork a worker
serves starts this template instead (``python -m corral.worker.fork_template``); the
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
TEMPLATE_MODULE = "corral.worker.fork_template"


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


# ----------------------------------------------------------------- the template process
def serve(sock: socket.socket) -> None:
    """Make a child for every request on ``sock`` until the worker closes it; report each
    child's exit. Single-threaded: ``os.fork`` here copies no other thread's state."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    while True:
        try:
            ready = {fd for fd, _ in poller.poll()}
        except InterruptedError:
            continue
        if wake_r in ready:
            os.read(wake_r, 4096)
            _report_exits(sock)
        if sock.fileno() in ready:
            data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 4)
            if not data:
                return  # the worker is gone or stopped the template
            _answer(sock, json.loads(data), fds, (wake_r, wake_w))


def _report_exits(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        sock.send(json.dumps({"exited": pid, "code": os.waitstatus_to_exitcode(status)}).encode())


def _answer(sock: socket.socket, request: dict, fds: list[int], own: tuple[int, int]) -> None:
    if len(fds) != 1:
        for fd in fds:
            os.close(fd)
        sock.send(json.dumps({"error": "a fork request carries one log pipe"}).encode())
        return
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        pid = os.fork()
    except OSError as exc:
        os.close(fds[0])
        sock.send(json.dumps({"error": f"fork: {exc}"}).encode())
        return
    if pid == 0:
        _become_worker(sock, request, fds[0], own)  # never returns
    os.close(fds[0])
    pidfd = os.pidfd_open(pid)  # before any waitpid here: the pid is still this child's
    try:
        socket.send_fds(sock, [json.dumps({"pid": pid}).encode()], [pidfd])
    finally:
        os.close(pidfd)


def _become_worker(sock: socket.socket, request: dict, log_fd: int, own: tuple[int, int]) -> None:
    """In the forked child: its own session, output, environment and secret pipe, then the
    worker's ``main``; exits with its exit code, never back into the template's loop."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        sock.close()
        for fd in own:
            os.close(fd)
        os.setsid()
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
        os.environ.clear()
        os.environ.update(request["env"])
        os.environ["CORRAL_PARENT_PID"] = str(os.getppid())
        read_end, write_end = os.pipe()
        os.write(write_end, request["secret"].encode())  # 64 bytes: fits the pipe buffer
        os.close(write_end)
        os.environ["CORRAL_SECRET_FD"] = str(read_end)
        from corral.worker.runtime import main

        sys.argv = [sys.argv[0]]
        main([])
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def template_main() -> None:
    """``python -m corral.worker.fork_template``: import the worker, then serve forks."""
    sock = socket.socket(fileno=int(os.environ.pop("CORRAL_TEMPLATE_FD")))
    import corral.worker.runtime  # noqa: F401  (what every child needs, imported once)
    from corral.worker.runtime import die_with_parent

    orphaned = die_with_parent()  # the template dies with its worker (and so its children)
    if orphaned:
        raise SystemExit(f"corral fork template: {orphaned}")
    serve(sock)


if __name__ == "__main__":
    template_main()
