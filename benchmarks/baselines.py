"""The machine's own limits, measured with nothing but Python, sockets and subprocesses.

Each corral figure is divided by one of these, measured in the same run:

* ``bare_start``: N ``python -c pass`` processes started in parallel, waited for together.
* ``import_floor``: the same, but each imports what a corral worker imports (diagnostic).
* ``EchoServer`` + ``pingpong``: a small request/reply over one loopback TCP connection
  (TCP_NODELAY) to a tiny echo server in another Python process.
* ``parallel_rate``: an asyncio client driving one connection to each of N echo servers.
* ``RawClient.roundtrip``: N bytes sent to the echo server and received back into a
  preallocated buffer (the server, like a worker, reads the whole message before answering).
* ``memcpy``: one in-process numpy copy of N bytes into a preallocated array.
* ``bare_stop``: SIGTERM to N idle Python processes, then reaping them.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
from echo_server import HEADER  # (bytes the client sends after the header, bytes to answer)

ECHO_SERVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "echo_server.py")

IDLE_CHILD = "import sys, time; print('up', flush=True); time.sleep(600)"


# ------------------------------------------------------------------ process starts
def bare_start(n: int, code: str = "pass", env: dict[str, str] | None = None) -> float:
    """Seconds to start ``n`` ``python -c code`` processes in parallel and wait for all."""
    full_env = {**os.environ, **(env or {})}
    procs: list[subprocess.Popen] = []
    try:
        started = time.perf_counter()
        for _ in range(n):
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", code],
                    env=full_env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        codes = [p.wait() for p in procs]
        elapsed = time.perf_counter() - started
    finally:  # interrupted: leave no child (and no zombie) behind
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    if any(codes):
        raise RuntimeError(f"baseline 'python -c {code!r}' failed with exit codes {codes}")
    return elapsed


# What a worker with cpu=1 gets (corral.envvars.thread_env): numpy's BLAS starts one thread.
WORKER_THREAD_ENV = {
    name: "1"
    for name in (
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "NUMEXPR_NUM_THREADS",
    )
}


def import_floor(n: int) -> float:
    """Like ``bare_start``, but each process imports the worker runtime with a worker's
    thread variables, then leaves without interpreter shutdown (diagnostic only)."""
    return bare_start(n, "import corral.worker.runtime, os; os._exit(0)", WORKER_THREAD_ENV)


def bare_stop(n: int) -> tuple[float, int]:
    """Start ``n`` idle Python processes, then time SIGTERM + reaping them all.

    Returns (seconds, processes still present afterwards).
    """
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", IDLE_CHILD],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        for _ in range(n)
    ]
    try:
        for p in procs:
            p.stdout.readline()
        started = time.perf_counter()
        for p in procs:
            os.kill(p.pid, signal.SIGTERM)
        for p in procs:
            p.wait()
        elapsed = time.perf_counter() - started
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            p.stdout.close()
    left = sum(1 for p in procs if os.path.exists(f"/proc/{p.pid}"))
    return elapsed, left


# ------------------------------------------------------------------ sockets
class EchoServer:
    """A tiny echo server in its own process; stop() it (the benchmark's cleanup does)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, ECHO_SERVER],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            text=True,
        )
        line = self.proc.stdout.readline().strip()
        if not line.isdigit():
            self.stop()
            raise RuntimeError(f"echo server did not start (said {line!r})")
        self.port = int(line)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _recv_exactly(sock: socket.socket, view: memoryview) -> None:
    got, total = 0, view.nbytes
    while got < total:
        n = sock.recv_into(view[got:], min(total - got, 1 << 24))
        if not n:
            raise ConnectionResetError("echo server closed the connection")
        got += n


def pingpong(port: int, request_bytes: int, reply_bytes: int, warmup: int, n: int) -> list[float]:
    """Latencies (seconds) of ``n`` request/reply exchanges on one connection."""
    message = HEADER.pack(request_bytes, reply_bytes) + b"x" * request_bytes
    reply = memoryview(bytearray(reply_bytes))
    latencies = []
    with _connect(port) as sock:
        for i in range(warmup + n):
            started = time.perf_counter()
            sock.sendall(message)
            _recv_exactly(sock, reply)
            if i >= warmup:
                latencies.append(time.perf_counter() - started)
    return latencies


def parallel_rate(ports: list[int], request_bytes: int, reply_bytes: int, total: int) -> float:
    """Exchanges per second of an asyncio client with one connection per server."""
    return asyncio.run(parallel_rate_async(ports, request_bytes, reply_bytes, total))


async def parallel_rate_async(
    ports: list[int], request_bytes: int, reply_bytes: int, total: int
) -> float:
    """``parallel_rate`` on the running event loop (to alternate with corral's gathers)."""
    message = HEADER.pack(request_bytes, reply_bytes) + b"x" * request_bytes
    per_conn = max(1, total // len(ports))

    async def one(port: int, count: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            for _ in range(count):
                writer.write(message)
                await reader.readexactly(reply_bytes)
        finally:
            writer.close()
            await writer.wait_closed()

    await asyncio.gather(*(one(p, 20) for p in ports))  # warm-up
    started = time.perf_counter()
    await asyncio.gather(*(one(p, per_conn) for p in ports))
    return per_conn * len(ports) / (time.perf_counter() - started)


class RawClient:
    """One kept-alive connection to an echo server, for bulk round trips."""

    def __init__(self, port: int, max_bytes: int):
        self.sock = _connect(port)
        self.payload = np.arange(max_bytes, dtype=np.uint8)
        self.back = np.empty(max_bytes, dtype=np.uint8)

    def roundtrip(self, nbytes: int) -> float:
        """Seconds to send ``nbytes`` and receive them back into a preallocated buffer."""
        started = time.perf_counter()
        self.sock.sendall(HEADER.pack(nbytes, nbytes))
        self.sock.sendall(memoryview(self.payload)[:nbytes])
        _recv_exactly(self.sock, memoryview(self.back)[:nbytes])
        elapsed = time.perf_counter() - started
        if not np.array_equal(self.payload[: min(nbytes, 4096)], self.back[: min(nbytes, 4096)]):
            raise RuntimeError("echo server returned different bytes")
        return elapsed

    def close(self) -> None:
        self.sock.close()


def memcpy(nbytes: int, reps: int) -> list[float]:
    """Seconds for one in-process copy of ``nbytes`` into a preallocated array."""
    src = np.arange(nbytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - started)
    return times
