"""The code that runs inside a Ray actor: the corral worker runtime hosted in a Ray
worker process, its environment and its log tee. The driver side (placement, launch,
poll, stop) is the rest of ``corral.backends.ray``; this module imports Ray only inside
the actor, and nothing of the driver side (Ray workers import it to build the actor)."""

from __future__ import annotations

import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
from typing import Any

from corral.safedirs import make_private_subdir
from corral.worker import env as E

TEE_READY_TIMEOUT_SECONDS = 10.0
VISIBLE_DEVICE_VARS = ("CUDA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES")
GROUP_RESOURCE_RE = re.compile(r"_group_(\d+)_([0-9a-f]+)$")


class RayWorkerActor:
    """The Ray actor that hosts one corral worker runtime in its own process.

    ``__init__`` starts the runtime (bind, register in name-resolve, serve) and the
    controller watch; ``wait_forever`` returns only when the runtime stopped, so a pending
    call of it tells the launcher, without polling the actor, when the actor died.
    """

    def __init__(
        self,
        env: dict[str, str],
        advertise_host: str | None = None,
        visible_devices: dict[str, str] | None = None,
        secret: str = "",
    ):
        # The environment comes as an argument, not as a per-actor runtime_env: an actor
        # without a runtime_env of its own runs in one of the worker processes Ray has
        # already started, instead of a fresh one per actor. Set it before anything that
        # reads it is imported (thread counts, visible devices).
        env = dict(env)
        env.pop(E.SECRET, None)  # never in the environment (read_secret refuses it)
        apply_worker_env(env)
        import ray

        from corral.worker.env import WorkerSettings, read_secret
        from corral.worker.runtime import ControllerWatch, WorkerRuntime

        self._done = threading.Event()
        self._stop_lock = threading.Lock()
        self._reason = "stopped"
        ctx = ray.get_runtime_context()
        node_ip = ray.util.get_node_ip_address()
        os.environ[E.BACKEND_ID] = ctx.get_actor_id()
        os.environ[E.NODE] = ctx.get_node_id()  # the worker's "host" for LOCAL_RANK
        os.environ[E.ADVERTISE_HOST] = advertise_host or node_ip
        for key, value in (visible_devices or {}).items():
            os.environ[key] = value
        settings = WorkerSettings.from_env(os.environ)
        secret = secret or read_secret(os.environ)
        self._tee = _start_tee(settings.log_dir, settings.role, settings.index)
        self.runtime = WorkerRuntime(
            settings, secret, on_shutdown=lambda: self._end("exited on request")
        )
        self.runtime.start()
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_sigterm)
        threading.Thread(
            target=ControllerWatch(self.runtime, self._controller_lost).run,
            name="corral-watch",
            daemon=True,
        ).start()
        from corral.backends.ray.private_api import held_group_resources

        group = {}
        for key in held_group_resources():  # per-bundle keys such as GPU_group_1_<pg id>
            match = GROUP_RESOURCE_RE.search(key)
            if match:
                group = {"bundle_index": int(match.group(1)), "pg_id": match.group(2)}
        self._info = {
            "address": self.runtime.address,
            "pid": os.getpid(),
            "host": os.environ[E.NODE],  # as the registration says (LOCAL_RANK counts per node)
            "hostname": socket.gethostname(),
            "node_ip": node_ip,
            "node_id": ctx.get_node_id(),
            "actor_id": ctx.get_actor_id(),
            "worker_ports": list(self.runtime.worker_ports),
            "generation": getattr(self.runtime, "generation", ""),
            "visible_devices": {k: os.environ[k] for k in VISIBLE_DEVICE_VARS if k in os.environ},
            "pg_id": group.get("pg_id") or ctx.get_placement_group_id(),
            "bundle_index": group.get("bundle_index"),
        }

    def info(self) -> dict:
        return self._info

    def ping(self) -> int:
        return os.getpid()

    def wait_forever(self) -> str:
        self._done.wait()
        return self._reason

    def free_port(self) -> tuple[str, int]:
        """A port the kernel found free on this node's IP (bound, then released)."""
        ip = self._info["node_ip"]
        with socket.socket() as sock:
            sock.bind((ip, 0))
            return ip, sock.getsockname()[1]

    def stop(self) -> bool:
        self._stop_now("stopped by the scheduler")
        return True

    def preempt_warning(self, reason: str) -> list[str]:
        """Ray drains this node (corral.backends.ray.drain): ``on_preempt(reason)`` on
        every engine that has it; returns the problems."""
        problems = self.runtime.engines.notify("on_preempt", reason)
        who = self.runtime.settings.worker_id
        print(f"corral worker {who}: {reason}: on_preempt", flush=True)
        for problem in problems:
            print(f"corral worker {who}: {problem}", flush=True)
        return problems

    def _stop_now(self, reason: str) -> None:
        """Stop the runtime once: engines, children and server; then drain the tee."""
        with self._stop_lock:
            if self._done.is_set():
                return
            self._reason = reason
            try:
                self.runtime.stop()
                print(f"corral worker {self.runtime.settings.worker_id} {reason}", flush=True)
            finally:
                _finish_tee(self._tee)
                self._tee = None
                self._done.set()

    def _on_sigterm(self, *_: Any) -> None:
        # The runtime's /shutdown (and anyone else) SIGTERMs this process. Ray's default
        # handler would end the whole actor process as a failure; instead the runtime
        # stops and the actor stays until the launcher removes it (its group holds the
        # resources either way).
        threading.Thread(target=self._stop_now, args=("exited on SIGTERM",), daemon=True).start()

    def _controller_lost(self, why: str) -> None:
        self._stop_now(f"exited: {why}")
        if self.runtime.settings.outlive:
            self._release_group()
        threading.Timer(0.5, os._exit, (0,)).start()

    def _end(self, reason: str) -> None:
        """Asked to exit (``/shutdown``). A detached worker (one that outlives its
        controller, corral.controller.adoption) also ends its process and removes its group, as
        ``corral stop`` may have asked it with no controller left to do that."""
        self._stop_now(reason)
        if self.runtime.settings.outlive:
            threading.Thread(target=self._release_group, daemon=True).start()
            threading.Timer(1.0, os._exit, (0,)).start()

    def _release_group(self) -> None:
        """Remove this detached worker's placement group (which ends this actor): its own
        group, or for a group shared by its role the one whose bundle 0 it holds, once the
        role's other workers are gone (up to 10 s). Forked workers leave it to their host."""
        if self.runtime.settings.forked:
            return
        import ray
        from ray.util.placement_group import remove_placement_group

        try:
            pg = ray.util.get_current_placement_group()
            if pg is None or (pg.bundle_count > 1 and self._info.get("bundle_index") != 0):
                return
            if pg.bundle_count > 1:
                _wait_siblings_gone(ray, ray.get_runtime_context().get_actor_name() or "")
            remove_placement_group(pg)
        except Exception as exc:
            print(f"corral worker: could not remove its placement group: {exc}", flush=True)


def _wait_siblings_gone(ray: Any, name: str, timeout: float = 10.0) -> None:
    """Until no other live actor is named like ``name`` but for its
    index (``<prefix>:<role>:<i>``: the role's other workers)."""
    import time

    stem = name.rpartition(":")[0] + ":"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]
        if not any(n.startswith(stem) and n != name and n[len(stem) :].isdigit() for n in names):
            return
        time.sleep(0.2)


def apply_worker_env(env: dict[str, str]) -> None:
    """Make this (possibly reused) Ray worker process carry exactly the worker's environment.

    ``CORRAL_*`` variables not in ``env`` (inherited from the raylet) are removed. Thread-count
    variables only take effect in libraries loaded after this point, so libraries already
    loaded in the process (torch, a BLAS behind numpy) are told the count directly.
    """
    for key in [k for k in os.environ if k.startswith("CORRAL_") and k not in env]:
        del os.environ[key]
    os.environ.update(env)
    if env.get("PYTHONUNBUFFERED"):
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.reconfigure(line_buffering=True)
            except (AttributeError, ValueError, OSError):
                pass
    threads = env.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        limit_loaded_thread_pools(int(threads))


def limit_loaded_thread_pools(n: int) -> None:
    """Set the thread count of numerical libraries that are already loaded (best effort)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            torch.set_num_threads(n)
        except Exception:
            pass
    if "numpy" in sys.modules:
        try:
            from threadpoolctl import threadpool_limits
        except ImportError:
            return
        threadpool_limits(limits=n)


def _start_tee(log_dir: str | None, role: str, index: int) -> tuple[subprocess.Popen, int] | None:
    """Send this process's stdout/stderr through a small tee process into corral's logs.

    The tee is a separate process so that the last lines before a crash still reach the
    log files: it drains the pipe until every writer is gone. Ray's own worker log keeps
    receiving everything too.
    """
    if not log_dir:
        return None
    try:
        make_private_subdir(os.path.join(log_dir, role))
    except OSError:
        return None  # no shared filesystem on this node: Ray's worker log only
    sys.stdout.flush()
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    ready_r, ready_w = os.pipe()
    original = os.dup(1)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", _TEE_CODE, log_dir, role, str(index), str(ready_w)],
            stdin=read_end,
            stdout=original,
            stderr=subprocess.DEVNULL,
            env=env,
            pass_fds=(ready_w,),
            start_new_session=True,
        )
    except OSError:
        os.close(write_end)
        os.close(original)
        return None
    finally:
        os.close(read_end)
        os.close(ready_w)
    # Until the tee has its files open: a worker that dies right after it registered
    # must still find its first lines in the log.
    try:
        poller = select.poll()  # not select.select: it refuses a descriptor above 1023
        poller.register(ready_r, select.POLLIN)
        poller.poll(TEE_READY_TIMEOUT_SECONDS * 1000)
    finally:
        os.close(ready_r)
    os.dup2(write_end, 1)
    os.dup2(write_end, 2)
    os.close(write_end)
    return proc, original


def _finish_tee(tee: tuple[subprocess.Popen, int] | None, timeout: float = 2.0) -> None:
    """Point stdout/stderr back at Ray's log and let the tee drain the pipe and exit.

    Ray kills a worker's children when the worker exits gracefully, so the tee must be
    done before the actor is killed."""
    if tee is None:
        return
    proc, original = tee
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
        pass
    os.dup2(original, 1)
    os.dup2(original, 2)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        pass


# Runs in the tee process: imports only corral.logs, so it starts in about 0.1 s.
_TEE_CODE = """
import os, sys
from corral.logs import LogSink
def report(text):
    try:
        os.write(1, ("corral: " + text + "\\n").encode())
    except OSError:
        pass
stream = LogSink(open(os.devnull, "rb"), sys.argv[1], sys.argv[2], int(sys.argv[3]), report)
os.write(int(sys.argv[4]), b"1")
os.close(int(sys.argv[4]))
while True:
    try:
        data = os.read(0, 65536)
    except InterruptedError:
        continue
    if not data:
        break
    try:
        os.write(1, data)
    except OSError:
        pass
    stream.feed(data)
stream.close()
"""
