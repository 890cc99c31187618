"""A worker: its RPC endpoints, its engines, its children, and its registration."""

from __future__ import annotations

import _signal  # signal's C module: signal.py loads enum (a worker's start)
import os
import sys
import threading
import time

from corral import cjson, name_resolve_keys
from corral.discovery import make_name_resolve
from corral.discovery.signed import SignedNameResolve
from corral.errors import ProtocolError
from corral.rpc import wire
from corral.rpc.envelope import failure, ok
from corral.rpc.http import PIPELINE_HEADER, REQUEST_ID_HEADER, Message
from corral.rpc.server import Deferred, Reply, RPCServer
from corral.worker import env as E
from corral.worker.broadcast import parse_flag
from corral.worker.controller_watch import ControllerWatch
from corral.worker.data_side import LazyWorkerData
from corral.worker.engines import NOT_HERE, EngineHost
from corral.worker.env import WorkerSettings, advertise_host, node_name, read_secret
from corral.worker.group_side import LazyGroupMember
from corral.worker.latch import StopLatch
from corral.worker.ports import reserve_ports
from corral.worker.replies import EngineCallReply, Route, uses_refs
from corral.worker.result_cache import BUSY, ResultCache

#: threads for the requests of pipelined connections that are not plain engine calls (as
#: many as a client used to have connections open to one worker, and then some)
SLOW_THREADS = 32


class WorkerRuntime:
    """Everything a worker does once started; usable in-process (the Ray actor hosts one)."""

    def __init__(
        self, settings: WorkerSettings, secret: str, on_shutdown=None, port: int = 0,
        engines: EngineHost | None = None,
    ):  # fmt: skip
        """``on_shutdown``: what ``POST /shutdown`` does (default: SIGTERM this process; a
        Ray actor passes its own stop). ``port``: 0 for one the kernel picks. ``engines``:
        default a new host (the scale benchmark's simulated workers share one)."""
        self.settings = settings
        self._on_shutdown = on_shutdown or (lambda: os.kill(os.getpid(), _signal.SIGTERM))
        self.name_resolve = SignedNameResolve(make_name_resolve(settings.name_resolve), secret)
        self.engines = engines or EngineHost()
        self._secret = secret
        self._forks = None  # a ForkManager from the first fork on (forks_made)
        self.cache = ResultCache()
        self._slow_pool = None  # pipelined requests not for the engine thread (_slow)
        self._lazy_lock = threading.Lock()
        self.stopped = threading.Event()
        self.shutdown_requested = False
        """Set by ``POST /shutdown``: the SIGTERM that follows is corral's own."""
        self.config: dict = {}
        self.worker_ports: list[int] = []
        self.generation = f"{time.time():.6f}-{os.getpid()}"
        advertised = advertise_host()
        try:
            self.server = RPCServer(
                secret,
                self.handle,
                host=settings.bind_host or advertised,
                port=port,
                identity=f"{settings.worker_id}#{self.generation}",
                delivered=self.cache.delivered,
                lendable=self._lendable,
                batches=self.engines,
            )
        except OSError as exc:
            raise SystemExit(
                f"corral worker: cannot listen on {settings.bind_host or advertised!r} "
                f"({exc}); set {E.ADVERTISE_HOST} to an address of this host, or "
                f"{E.BIND_HOST}=0.0.0.0 to listen on every interface"
            ) from None
        self.address = f"{advertised}:{self.server.port}"
        # the data plane (refs, keep, /data/*) is imported and made on first use
        self.data = LazyWorkerData(settings, self.generation, self.name_resolve, secret)
        self.groups = LazyGroupMember(settings.worker_id, advertised)  # cross-role groups
        data_routes = lambda: self.data.get().routes  # noqa: E731
        self._routes = {  # the one table of endpoints (see Route)
            ("GET", "/health"): Route(self._health, raw=True),
            ("POST", "/data/get"): Route(lambda msg: data_routes().get(msg), raw=True),
            ("POST", "/data/chunk"): Route(lambda msg: data_routes().chunk(msg), raw=True),
            ("POST", "/call"): Route(self._call, engine_call=True),
            ("POST", "/create_engine"): Route(self._create_engine),
            ("POST", "/set_env"): Route(self._set_env, inline=True),
            ("POST", "/configure"): Route(self._configure, inline=True, rebuild=False),
            ("POST", "/destroy_engines"): Route(self._destroy_engines),
            ("POST", "/fork"): Route(self._fork),
            ("POST", "/kill_forked_worker"): Route(self._kill_forked),
            ("POST", "/shutdown"): Route(self._shutdown),
            ("POST", "/data/free"): Route(lambda p: data_routes().free(p)),
            ("POST", "/data/stats"): Route(lambda p: data_routes().stats(p)),
            ("POST", "/data/split"): Route(lambda p: data_routes().split(p)),
            ("POST", "/dp_layout"): Route(self._dp_layout),
            ("POST", "/group/open"): Route(self.groups.open),
            ("POST", "/group/join"): Route(self.groups.join),
            ("POST", "/group/destroy"): Route(self.groups.destroy),
        }

    # made on first use -----------------------------------------------------
    @property
    def forks(self):
        """The ``ForkManager`` of this worker's children (imported on the first fork)."""
        if self._forks is None:
            with self._lazy_lock:
                if self._forks is None:
                    from corral.worker.fork import ForkManager

                    self._forks = ForkManager(self.settings, self.name_resolve, self._secret)
        return self._forks

    def child_processes(self) -> list:
        """The processes of the children this worker forked (none before the first fork)."""
        forks = self._forks
        return [] if forks is None else [c.proc for c in list(forks.children.values())]

    @property
    def _slow(self):
        """The bounded pool for pipelined requests that are not plain engine calls."""
        if self._slow_pool is None:
            with self._lazy_lock:
                if self._slow_pool is None:
                    from concurrent.futures import ThreadPoolExecutor

                    self._slow_pool = ThreadPoolExecutor(
                        SLOW_THREADS, thread_name_prefix="corral-call"
                    )
        return self._slow_pool

    # lifecycle -------------------------------------------------------------
    def start(self) -> None:
        if self.settings.engines:
            self.data.get()  # engine code may keep values (corral.data.keep)
        for name, path in self.settings.engines.items():
            self.engines.create(name, path, [], {})
        self.worker_ports = reserve_ports(max(self.settings.port_count - 1, 1))
        self.server.start()
        s = self.settings
        info = {
            "pid": os.getpid(),
            "host": node_name(),
            "worker_ports": [str(p) for p in [self.server.port, *self.worker_ports]],
            "generation": self.generation,
            "backend_id": s.backend_id,
            "forked": s.forked,
            "run_id": s.run_id,
            "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"),
        }
        self.name_resolve.add(
            name_resolve_keys.worker_info_key(s.experiment, s.trial, s.role, s.index),
            cjson.dumps(info),
            replace=True,
        )
        self.name_resolve.add(
            name_resolve_keys.worker_address_key(s.experiment, s.trial, s.role, s.index),
            self.address,
            replace=True,
        )
        print(
            f"corral worker {s.worker_id} serving at {self.address} (pid {os.getpid()})", flush=True
        )
        from corral.worker.usage import start_report  # CPU/memory for the live view

        start_report(self)

    def stop(self) -> None:
        if self.stopped.is_set():
            return
        self.stopped.set()
        s = self.settings
        try:
            self.engines.destroy_all()
        finally:
            if self._forks is not None:
                self._forks.kill_all()
            self.engines.close()
            address_key = name_resolve_keys.worker_address_key(
                s.experiment, s.trial, s.role, s.index
            )
            try:
                # a newer worker (a restart, another run) may own the names by now
                if self.name_resolve.get(address_key) == self.address:
                    self.name_resolve.delete(address_key)
                    for key in (
                        name_resolve_keys.worker_info_key,
                        name_resolve_keys.worker_usage_key,
                    ):
                        self.name_resolve.delete(key(s.experiment, s.trial, s.role, s.index))
            except Exception:
                pass
            self.server.stop()
            if self._slow_pool is not None:
                self._slow_pool.shutdown(wait=False, cancel_futures=True)

    # dispatch --------------------------------------------------------------
    def handle(self, msg: Message) -> Reply:
        """Every request, by its ``Route``: a raw one answers the message itself; any other
        gets the decoded payload, once per request id (the result cache), and is answered
        in the envelope: from the engine thread (a synchronous engine call), from the pool
        (a pipelined connection: the next request must not wait) or here."""
        route = self._routes.get((msg.method, msg.path))
        if route is None:
            return Reply(404, [f"no endpoint {msg.method} {msg.path}".encode()], "text/plain")
        if route.raw:
            return route.fn(msg)
        refs: list = []
        try:
            # The peer proved it holds the trial secret: rebuild its dataclasses and enums
            # by importing their modules (see corral.rpc.wire, "Decoding policy").
            payload = wire.decode(msg.body, refs, import_types=route.rebuild) if msg.body else {}
            if not isinstance(payload, dict):
                raise ProtocolError("request body must be a mapping")
        except ProtocolError as exc:
            return failure(400, exc)
        if refs:
            payload = {**payload, "_refs": refs}
        request_id = msg.headers.get(REQUEST_ID_HEADER)
        # on the engine thread (a lent connection), or while holding back a batch for it
        # (rpc.server), nothing may wait for the engine thread
        here = self.engines.busy_here()
        if request_id:
            cached = self.cache.begin(request_id, wait=not here)
            if cached is BUSY:  # its first attempt is queued behind us: wait elsewhere
                return Deferred(
                    lambda send: self._slow.submit(self._answer_later, request_id, send)
                )
            if cached is not None:
                return cached
        try:
            if route.engine_call and msg.keep_alive:
                run = None
                if not uses_refs(payload):
                    if here and self.engines.on_engine_thread() and self.engines.idle():
                        result = self._prepare_call(payload, here=True)  # run here and now
                        if result is not NOT_HERE:
                            return self._finish(request_id, ok(result))
                    run = self._prepare_call(payload)
                if run is not None:  # a synchronous method: reply from the engine thread
                    park = self.engines.park
                    return Deferred(
                        lambda send, lease: self.engines.submit(
                            EngineCallReply(self._finish, request_id, run, send, lease, park)
                        ),
                        lends=True,
                    )
            if (here or PIPELINE_HEADER in msg.headers) and msg.keep_alive and not route.inline:
                return Deferred(  # the next request must not wait
                    lambda send: self._slow.submit(
                        self._run_and_send, request_id, route.fn, payload, send
                    )
                )
            reply = ok(route.fn(payload))
        except Exception as exc:
            reply = failure(500, exc)
        return self._finish(request_id, reply)

    def _lendable(self, msg: Message) -> bool:
        """A request the engine thread may read and handle on a connection lent to it."""
        route = self._routes.get((msg.method, msg.path))
        return route is not None and route.engine_call

    def _answer_later(self, request_id: str, send) -> None:
        """A retry met on the engine thread while its first attempt runs: its reply,
        waited for on the pool (one forgotten meanwhile is not run again here)."""
        reply = self.cache.begin(request_id)
        if reply is None:
            gone = ProtocolError(f"request {request_id} is gone; send a new request id")
            reply = self._finish(request_id, failure(410, gone))
        send(reply)

    def _finish(self, request_id: str | None, reply: Reply) -> Reply:
        if request_id:
            self.cache.finish(request_id, reply)
        return reply

    def _run_and_send(self, request_id: str | None, fn, payload: dict, send) -> None:
        """A request that is not a plain synchronous engine call (a coroutine method, refs,
        ``create_engine``, ``fork``...) from a pipelined connection, run on a thread of
        the pool: the requests behind it are read and run meanwhile, as they would be on
        connections of their own. It replies from there."""
        try:
            reply = ok(fn(payload))
        except Exception as exc:
            reply = failure(500, exc)
        send(self._finish(request_id, reply))

    def _prepare_call(self, p: dict, here: bool = False):
        """``EngineHost.prepare`` of a ``/call``; ``here``: ``EngineHost.call_here``."""
        name = p.get("engine_name") or self.settings.worker_id
        args, kwargs = list(p.get("args", [])), dict(p.get("kwargs", {}))
        start = self.engines.call_here if here else self.engines.prepare
        broadcast = p.get("broadcast")
        if broadcast is not None:
            broadcast = parse_flag(broadcast)
        return start(name, p["method"], args, kwargs, broadcast)

    def _health(self, _payload: object) -> Reply:
        s = self.settings
        body = {
            "status": "ok",
            "worker_id": s.worker_id,
            "generation": self.generation,
            "pid": os.getpid(),
            "engines": sorted(self.engines.engines),
            "forked_children": sorted(self._forks.children if self._forks else ()),
        }
        return Reply(200, [cjson.dumps(body).encode()], "application/json")

    def _create_engine(self, p: dict) -> None:
        name = p.get("engine_name") or self.settings.worker_id
        args, kwargs = list(p.get("args", [])), dict(p.get("kwargs", {}))
        data = self.data.get()  # engine code may keep values (corral.data.keep)
        if p.get("_refs"):  # refs in the constructor's arguments: fetched like a call's
            args, kwargs = data.refs.resolve((args, kwargs), p["_refs"])
        self.engines.create(name, p["engine"], args, kwargs)
        return name

    def _call(self, p: dict) -> object:
        name = p.get("engine_name") or self.settings.worker_id
        args, kwargs = list(p.get("args", [])), dict(p.get("kwargs", {}))
        data = self.data.get() if uses_refs(p) else None
        if data is not None and p.get("_refs"):  # the engine gets the refs' values
            args, kwargs = data.refs.resolve((args, kwargs), p["_refs"])
        broadcast = parse_flag(p.get("broadcast"))
        result = self.engines.call(name, p["method"], args, kwargs, broadcast)
        keep = None if data is None else data.parse_keep(p.get("keep"))
        return result if keep is None else data.store.keep_tree(result, keep)

    def _dp_layout(self, p: dict) -> dict:
        from corral.worker.dp_layout import layout  # dispatch(mode="engine") only

        name = p.get("engine_name") or self.settings.worker_id
        return layout(self.engines.get(name), name)

    def _set_env(self, p: dict) -> None:
        env = p.get("env", {})
        if not isinstance(env, dict):
            raise ProtocolError("env must be a mapping of str to str")
        for key, value in env.items():
            os.environ[str(key)] = str(value)

    def _configure(self, p: dict) -> None:
        from corral.worker.seeding import configure  # once per worker

        self.config = configure(p)

    def _destroy_engines(self, _p: dict) -> list[str]:
        if self.data.made is not None:
            self.data.made.store.clear()
        return self.engines.destroy_all()

    def _fork(self, p: dict) -> dict:
        return self.forks.fork(
            p["role"],
            int(p["index"]),
            p.get("module"),
            dict(p.get("env", {})),
            float(p.get("timeout", 60)),
        )

    def _kill_forked(self, p: dict) -> bool:
        return self.forks.kill(str(p["worker_id"]))

    def _shutdown(self, _p: dict) -> None:
        self.shutdown_requested = True
        threading.Thread(target=self._shutdown_soon, daemon=True).start()

    def _shutdown_soon(self) -> None:
        time.sleep(0.05)
        self._on_shutdown()


def main(argv: list[str] | None = None) -> None:
    """Run a worker. ``argv``: the command-line contract of corral.worker.args (AReaL's
    arguments; ``--port`` picks the port to serve on)."""
    words = sys.argv[1:] if argv is None else argv
    port = 0
    if words:  # AReaL's arguments: a module of the user's that ends by running this
        from corral.worker.args import parse

        port = parse(words).port

    settings = WorkerSettings.from_env()
    secret = read_secret()
    for name in (E.SECRET,):
        os.environ.pop(name, None)
    runtime = WorkerRuntime(settings, secret, port=port)
    stop = StopLatch()  # not a threading.Event: set from signal handlers (see latch.py)
    lost = stop.set

    _signal.signal(_signal.SIGTERM, lambda *_: lost("SIGTERM"))
    _signal.signal(_signal.SIGINT, lambda *_: lost("SIGINT"))
    # a warning before preemption or the time limit (sbatch --signal=USR1@N)
    _signal.signal(
        _signal.SIGUSR1,
        lambda *_: threading.Thread(target=preempted, args=("SIGUSR1",), daemon=True).start(),
    )

    def preempted(why: str) -> None:
        """Engines may checkpoint: ``on_preempt(reason)`` runs on each one that has it
        (first: the log copier may already be gone with the same signal)."""
        problems = runtime.engines.notify("on_preempt", why)
        try:
            print(f"corral worker {settings.worker_id}: {why} from outside: on_preempt", flush=True)
            for problem in problems:
                print(f"corral worker {settings.worker_id}: {problem}", flush=True)
        except OSError:
            pass

    runtime.start()
    # after registering: a parent that died before is caught by its pid
    if settings.die_with_parent:
        from corral.worker.parent_death import watch_parent

        orphaned = watch_parent()
    else:
        orphaned = None
    if orphaned:
        lost(orphaned)
    threading.Thread(
        target=ControllerWatch(runtime, lost).run, name="corral-watch", daemon=True
    ).start()
    why = stop.wait()
    from corral.worker.ending import arm_stop_watchdog

    outside = why == "SIGTERM" and not runtime.shutdown_requested
    arm_stop_watchdog(runtime, 128 + _signal.SIGTERM if outside else 0, why)
    if outside:
        preempted("SIGTERM")  # preemption, requeue, time limit or an outside scancel
    try:
        print(f"corral worker {settings.worker_id} stopping: {why}", flush=True)
    except OSError:
        pass  # the output pipe's reader went with the same signal
    runtime.stop()
    if outside:  # say how it ended, as a process killed by SIGTERM would
        sys.exit(128 + _signal.SIGTERM)
