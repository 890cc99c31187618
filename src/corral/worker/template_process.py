"""The fork template's own process (``python -m corral.worker.template_process``): it
imports the worker once, stays single-threaded, and forks a child worker for every request
of its worker (the protocol: corral.worker.fork_template)."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys

from corral.worker.fork_template import MAX_MESSAGE


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
        reply = {"seq": request.get("seq"), "error": "a fork request carries one log pipe"}
        sock.send(json.dumps(reply).encode())
        return
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        pid = os.fork()
    except OSError as exc:
        os.close(fds[0])
        sock.send(json.dumps({"seq": request.get("seq"), "error": f"fork: {exc}"}).encode())
        return
    if pid == 0:
        _become_worker(sock, request, fds[0], own)  # never returns
    os.close(fds[0])
    pidfd = os.pidfd_open(pid)  # before any waitpid here: the pid is still this child's
    try:
        socket.send_fds(
            sock, [json.dumps({"seq": request.get("seq"), "pid": pid}).encode()], [pidfd]
        )
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
    from corral.worker.parent_death import die_with_parent

    orphaned = die_with_parent()  # the template dies with its worker (and so its children)
    if orphaned:
        raise SystemExit(f"corral fork template: {orphaned}")
    serve(sock)


if __name__ == "__main__":
    template_main()
