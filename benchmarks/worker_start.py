"""A worker's own start: from spawn to registered, N in parallel (issue 29).

``create_workers`` (the ``local.cold_start`` rows) adds the controller's own work: checks,
environments, the spawner thread, the log pump and the registration poll. This measures
only what a worker pays itself: N ``python -m corral.worker`` processes started at once with
the environment and arguments the local backend gives them (``worker_environment``,
``args_from_env``, ``CORRAL_DIE_WITH_PARENT=1``), until each has printed the line it
prints after its name-resolve records are written (``serving at``). The baseline is N bare
``python -c pass`` started the same way, measured in the same minute, interleaved.

    python benchmarks/worker_start.py [N ...]     # prints one line per N
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time

READY = b"serving at"


def worker_envs(fileroot: str, n: int, role: str) -> list[tuple[list[str], dict[str, str]]]:
    """argv and environment of ``n`` workers as the local backend would start them."""
    from corral.worker.env import DIE_WITH_PARENT, worker_environment

    secret = os.path.join(fileroot, "secret")
    if not os.path.exists(secret):
        fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, os.urandom(32).hex().encode())
        os.close(fd)
    records = os.path.join(fileroot, "records")
    os.makedirs(records, mode=0o700, exist_ok=True)
    out = []
    for index in range(n):
        env = worker_environment(
            experiment="start",
            trial="t0",
            role=role,
            index=index,
            name_resolve={"type": "nfs", "root": records},
            log_dir=os.path.join(fileroot, "logs"),
            port_count=1,
            lease_timeout=30.0,
            cpu=1,
            fileroot=fileroot,
            secret_file=secret,
        )
        env[DIE_WITH_PARENT] = "1"
        env["CORRAL_PARENT_PID"] = str(os.getpid())
        argv = [sys.executable, "-m", "corral.worker"]  # as corral.backends.local starts it
        out.append((argv, {**os.environ, **env}))
    return out


def start_workers(
    fileroot: str, n: int, role: str, timeout: float = 120.0, env: dict[str, str] | None = None
) -> tuple[float, float]:
    """Seconds from the first spawn until all ``n`` workers said they are registered, and
    the CPU seconds the ``n`` processes used (all threads, until each was SIGKILLed right
    after it said so: on a loaded machine the CPU time moves less than the wall time)."""
    plans = [(argv, {**e, **(env or {})}) for argv, e in worker_envs(fileroot, n, role)]
    procs: list[subprocess.Popen] = []
    cpu = 0.0
    sel = selectors.DefaultSelector()
    try:
        started = time.perf_counter()
        for argv, full_env in plans:
            proc = subprocess.Popen(
                argv,
                env=full_env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            procs.append(proc)
            sel.register(proc.stdout, selectors.EVENT_READ, [proc, b""])
        waiting = n
        while waiting:
            if time.perf_counter() - started > timeout:
                raise TimeoutError(f"{waiting} of {n} workers not registered after {timeout}s")
            for key, _ in sel.select(timeout=1.0):
                proc, seen = key.data
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    raise RuntimeError(f"a worker ended before it registered: {seen[-2000:]!r}")
                key.data[1] = seen = seen + chunk
                if READY in seen:
                    sel.unregister(key.fileobj)
                    os.killpg(proc.pid, signal.SIGKILL)  # its CPU time stops here
                    waiting -= 1
        elapsed = time.perf_counter() - started
    finally:
        sel.close()
        for proc in procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for proc in procs:
            _, _, usage = os.wait4(proc.pid, 0)
            proc.returncode = -signal.SIGKILL
            cpu += usage.ru_utime + usage.ru_stime
            proc.stdout.close()
    return elapsed, cpu


def bare_start(n: int) -> tuple[float, float]:
    """``baselines.bare_start`` (N ``python -c pass`` in parallel), with their CPU seconds."""
    procs: list[subprocess.Popen] = []
    cpu = 0.0
    try:
        started = time.perf_counter()
        for _ in range(n):
            procs.append(subprocess.Popen([sys.executable, "-c", "pass"], stdin=subprocess.DEVNULL))
        for proc in procs:
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
            cpu += usage.ru_utime + usage.ru_stime
        elapsed = time.perf_counter() - started
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                proc.wait()
    return elapsed, cpu


def rows(fileroot: str, sizes: list[int], reps: int) -> list:
    """``local.worker_start.n{N}`` rows: a worker's own start vs N bare ``python -c pass``,
    interleaved rep by rep (the same minute), medians; CPU seconds as a diagnostic."""
    from common import Row, Target, log, median, rounded

    out = []
    for n in sizes:
        worker: list[tuple[float, float]] = []
        bare: list[tuple[float, float]] = []
        for rep in range(reps):
            bare.append(bare_start(n))
            worker.append(start_workers(fileroot, n, f"start{n}r{rep}"))
        log(
            f"worker start n={n}: {median(w for w, _ in worker):.3f}s "
            f"(CPU {median(c for _, c in worker):.3f}s), bare python "
            f"{median(b for b, _ in bare):.3f}s (CPU {median(c for _, c in bare):.3f}s)"
        )
        cpu, bare_cpu = median(c for _, c in worker), median(c for _, c in bare)
        out.append(
            Row(
                key=f"local.worker_start.n{n}",
                backend="local",
                label=f"a worker's own start, {n} in parallel (spawn to registered)",
                unit="s",
                value=median(w for w, _ in worker),
                baseline=median(b for b, _ in bare),
                baseline_label=f"{n} x `python -c pass` in parallel, interleaved",
                targets=[Target("ratio", "<=", 3.0, "<= 3x bare")],
                samples={
                    "corral": rounded(w for w, _ in worker),
                    "baseline": rounded(b for b, _ in bare),
                    "corral_cpu": rounded(c for _, c in worker),
                    "baseline_cpu": rounded(c for _, c in bare),
                },
                extra={
                    "cpu_ratio": round(cpu / bare_cpu, 3) if bare_cpu else None,
                    "note": "python -m corral.worker with the local backend's environment, "
                    "until it printed that it registered; CPU: all its threads until then",
                },
            )
        )
    return out


def main(sizes: list[int]) -> None:
    from common import ensure_corral_bytecode, median

    ensure_corral_bytecode()  # workers read it, as from an installed package (run.py does too)

    with tempfile.TemporaryDirectory(prefix="corral-start-") as root:
        os.chmod(root, 0o700)
        for n in sizes:
            worker, bare = [], []
            for rep in range(5):
                bare.append(bare_start(n))
                worker.append(start_workers(root, n, f"r{n}x{rep}"))
            w, b = median(x[0] for x in worker), median(x[0] for x in bare)
            wc, bc = median(x[1] for x in worker), median(x[1] for x in bare)
            print(
                f"n={n}: worker {w * 1000:.1f} ms, bare {b * 1000:.1f} ms, {w / b:.2f}x; "
                f"CPU {wc * 1000:.1f} ms vs {bc * 1000:.1f} ms, {wc / bc:.2f}x"
            )


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main([int(a) for a in sys.argv[1:]] or [1, 8])
