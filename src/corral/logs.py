"""Worker logs: one file per replica, one per role and one merged file with a prefix."""

from __future__ import annotations

import errno
import os
import selectors
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from corral.paths import (  # noqa: F401  (re-exported: the paths' owner is corral.paths)
    log_dir_for,
    merged_log_path,
    replica_log_path,
    role_log_path,
)
from corral.safedirs import make_private_subdir, open_private_append

TYPE_CHECKING = False  # typing's, without importing typing (a worker's first fork)
if TYPE_CHECKING:
    from typing import IO


def tail(path: str | None, lines: int = 20, max_bytes: int = 16384) -> str:
    if not path:
        return ""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            data = fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


RETRY_WRITE_SECONDS = 5.0


class OpenFiles:
    """Append-mode files shared by many log sinks, at most ``limit`` open at once: the
    least recently written one is closed and reopened on its next write. A controller
    with thousands of workers thus holds a fixed number of log file descriptors."""

    def __init__(self, limit: int = 16):
        self.limit = limit
        self._open: OrderedDict[str, IO[bytes]] = OrderedDict()

    def handle(self, path: str) -> IO[bytes]:
        fh = self._open.get(path)
        if fh is None:
            fh = self._open[path] = open_private_append(path)  # 0600
            while len(self._open) > self.limit:
                _close_quietly(self._open.popitem(last=False)[1])
        else:
            self._open.move_to_end(path)
        return fh

    def release(self, path: str) -> None:
        fh = self._open.pop(path, None)
        if fh is not None:
            _close_quietly(fh)

    def close(self) -> None:
        while self._open:
            _close_quietly(self._open.popitem()[1])


def _close_quietly(fh: IO[bytes]) -> None:
    try:
        fh.close()
    except OSError:
        pass


class _LogFile:
    """One append-only log file that survives a full disk: a failed write drops that
    output (counted), later writes are retried every few seconds, and the first write
    that succeeds again notes how much was lost. The worker never blocks on its logs.
    Its descriptor comes from a shared ``OpenFiles``."""

    def __init__(self, path: str, on_error: Callable[[str], None] | None, files: OpenFiles):
        self.path = path
        self.on_error = on_error
        self.files = files
        self.lost = 0
        self.retry_at = 0.0
        try:
            open_private_append(path).close()  # exists from the start (error messages tail it)
        except OSError as exc:
            self._failed(exc, 0, time.monotonic())

    def write(self, data: bytes) -> None:
        now = time.monotonic()
        if self.lost and now < self.retry_at:
            self.lost += len(data)
            return
        try:
            fh = self.files.handle(self.path)
            if self.lost:
                fh.write(
                    f"[corral: {self.lost} bytes of output lost: {self.path} could "
                    "not be written]\n".encode()
                )
            fh.write(data)
            self.lost = 0
        except OSError as exc:
            self.files.release(self.path)
            self._failed(exc, len(data), now)

    def _failed(self, exc: OSError, size: int, now: float) -> None:
        first = not self.lost
        self.lost += max(size, 1)
        self.retry_at = now + RETRY_WRITE_SECONDS
        if first and self.on_error is not None:
            hint = (
                "the disk is full: free space under the log directory or move cluster.fileroot"
                if exc.errno in (errno.ENOSPC, errno.EDQUOT)
                else "check the log directory"
            )
            self.on_error(
                f"cannot write worker log {self.path}: {exc.strerror} ({hint}); "
                "its output is dropped until writes succeed again, the worker runs on"
            )


class LogSink:
    """Writes one worker's output to its replica, role and merged log files."""

    def __init__(
        self,
        pipe: IO[bytes],
        log_dir: str,
        role: str,
        index: int,
        on_error: Callable[[str], None] | None = None,
        files: OpenFiles | None = None,
    ):
        self.pipe = pipe
        self.prefix = f"[{role}/{index}] ".encode()
        self.partial = b""
        self._own_files = files is None
        self.files = OpenFiles(3) if files is None else files
        make_private_subdir(os.path.join(log_dir, role))  # logs: 0600 files in 0700 dirs
        self.replica = _LogFile(replica_log_path(log_dir, role, index), on_error, self.files)
        self.role = _LogFile(role_log_path(log_dir, role), on_error, self.files)
        self.merged = _LogFile(merged_log_path(log_dir), on_error, self.files)

    def feed(self, data: bytes) -> None:
        self.replica.write(data)
        data = self.partial + data
        *lines, self.partial = data.split(b"\n")
        if lines:
            text = b"".join(self.prefix + line + b"\n" for line in lines)
            self.role.write(text)
            self.merged.write(text)

    def close(self) -> None:
        if self.partial:
            self.feed(b"\n")
        _close_quietly(self.pipe)
        if self._own_files:
            self.files.close()
        else:
            self.files.release(self.replica.path)


class LogPump:
    """One thread copying worker output pipes into their three log files, line by line."""

    def __init__(
        self,
        on_error: Callable[[str], None] | None = None,
        on_output: Callable[[], None] | None = None,
    ) -> None:
        """``on_output``: called on the pump's thread after each read from a pipe (output
        copied to the logs, or the pipe's end)."""
        self.on_error = on_error or (lambda text: print(f"corral: {text}", file=sys.stderr))
        self.on_output = on_output
        self._sel = selectors.DefaultSelector()
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._thread: threading.Thread | None = None
        self._closed = False
        self._files = OpenFiles()

    def add(self, pipe: IO[bytes], log_dir: str, role: str, index: int) -> None:
        stream = LogSink(pipe, log_dir, role, index, lambda text: self.on_error(text), self._files)
        with self._lock:
            self._sel.register(pipe, selectors.EVENT_READ, stream)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="corral-logs", daemon=True)
                self._thread.start()
        os.write(self._wake_w, b"x")

    def _run(self) -> None:
        while not self._closed:
            for key, _ in self._sel.select(timeout=1.0):
                stream = key.data
                if stream is None:
                    os.read(self._wake_r, 4096)
                    continue
                try:
                    data = os.read(key.fd, 65536)
                except OSError:
                    data = b""
                if data:
                    stream.feed(data)
                else:
                    with self._lock:
                        self._sel.unregister(key.fileobj)
                    stream.close()
                if self.on_output is not None:
                    self.on_output()

    def flush_closed(self, timeout: float = 1.0) -> None:
        """Wait briefly until every pipe whose writer exited has been drained."""
        import time

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if len(self._sel.get_map()) <= 1:
                    return
            time.sleep(0.02)
