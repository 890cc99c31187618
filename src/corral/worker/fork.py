"""Children forked by a worker on request of the authenticated controller."""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time

from corral import name_resolve_keys
from corral.discovery.base import NameResolve
from corral.errors import ConfigError, WorkerCreationError
from corral.logs import LogPump, replica_log_path, tail
from corral.names import validate_role_name
from corral.procs import describe_returncode, spawn, stop_process_groups
from corral.rpc.gate import warn
from corral.worker import env as E
from corral.worker.args import DEFAULT_WORKER_MODULES, contract_args, free_port, module_argv
from corral.worker.engines import is_stdlib_module
from corral.worker.env import WorkerSettings, advertise_host, node_name

_MODULE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


class Child:
    """One forked child: its role, index and process. A plain class: the first fork of a
    worker does not import ``dataclasses`` (with ``inspect``)."""

    __slots__ = ("role", "index", "proc")

    def __init__(self, role: str, index: int, proc: subprocess.Popen):
        self.role, self.index, self.proc = role, index, proc


class ForkManager:
    """Starts and stops child workers. Children are spawned from one long-lived thread so
    that their parent-death signal (PR_SET_PDEATHSIG) fires only when this process dies."""

    def __init__(self, settings: WorkerSettings, name_resolve: NameResolve, secret: str = ""):
        """``secret`` reaches each child through a pipe, never its environment."""
        self.settings = settings
        self._secret = secret
        self.name_resolve = name_resolve
        self.children: dict[str, Child] = {}
        self._starting: dict[str, bool] = {}  # child id -> cancelled before it was spawned
        self._lock = threading.Lock()
        self._pump = LogPump()
        self._template = None  # a fork_template.Template from the first fork on
        self._template_lock = threading.Lock()

    def fork(self, role: str, index: int, module: str | None, env: dict, timeout: float) -> dict:
        validate_role_name(role, "fork.role")
        module = module or "corral.worker"
        if not _MODULE.fullmatch(module):
            raise ConfigError(
                "fork.command", module, "name a Python module such as 'corral.worker'"
            )
        if is_stdlib_module(module):
            raise ConfigError(
                "fork.command",
                module,
                "standard-library modules (http.server, pydoc, code ...) are refused: name "
                "corral.worker or a worker module of your own package",
            )
        child_id = f"{role}/{index}"
        with self._lock:
            if child_id in self.children or child_id in self._starting:
                raise WorkerCreationError(f"this worker already forked {child_id}")
            self._starting[child_id] = False
        try:
            return self._fork(child_id, role, index, module, env, timeout)
        finally:
            with self._lock:
                self._starting.pop(child_id, None)

    def _fork(
        self, child_id: str, role: str, index: int, module: str, env: dict, timeout: float
    ) -> dict:
        child_env = dict(os.environ)
        child_env.update({str(k): str(v) for k, v in env.items()})
        child_env.update({
            E.ROLE: role,
            E.INDEX: str(index),
            E.FORKED: "1",
            E.DIE_WITH_PARENT: "1",
        })  # fmt: skip
        child_env.pop(E.INDEX_OFFSET, None)
        for name in (E.SECRET, E.SECRET_FILE):
            child_env.pop(name, None)
        s = self.settings
        address_key = name_resolve_keys.worker_address_key(s.experiment, s.trial, role, index)
        self.name_resolve.delete(address_key)
        self.name_resolve.delete(
            name_resolve_keys.worker_health_key(s.experiment, s.trial, role, index)
        )
        own = module in DEFAULT_WORKER_MODULES
        port = 0 if own else free_port()
        proc = self._from_template(child_env, timeout) if own else None
        if proc is None:
            argv = module_argv(module)
            if not own:  # a module of the user's gets AReaL's arguments; corral's reads env
                argv += contract_args(
                    port=port,
                    experiment=s.experiment,
                    trial=s.trial,
                    role=role,
                    index=index,
                    name_resolve=s.name_resolve,
                    fileroot=child_env.get(E.FILEROOT, ""),
                    host="0.0.0.0",
                )
            proc = self._spawn(argv, child_env)
        with self._lock:
            self.children[child_id] = Child(role, index, proc)
            cancelled = self._starting.get(child_id, False)
        if cancelled:  # kill() came while it was being spawned: its caller gave up
            self.kill(child_id)
            raise WorkerCreationError(f"forked worker {child_id} was stopped while starting")
        # a foreign server (corral.foreign) is ready when it answers GET /health on --port
        if not own:  # http.client (with email and ssl) for the probe: foreign modules only
            from corral.foreign import PROBE_INTERVAL, answers_health
        foreign = None if own else {
            "address": f"{advertise_host()}:{port}", "worker_ports": [str(port)],
            "host": node_name(), "pid": proc.pid, "foreign": True,
        }  # fmt: skip
        if s.log_dir:
            self._pump.add(proc.stdout, s.log_dir, role, index)
        started = time.monotonic()
        deadline = started + timeout
        # a child starts in tens of ms: look every 1-2 ms in its first second (a look at a
        # missing record is one failed open), then every 10 ms
        pause = 0.001
        next_probe = 0.0
        while time.monotonic() < deadline:
            if foreign is not None and time.monotonic() >= next_probe:
                if answers_health("127.0.0.1", port):
                    self._watch(child_id)
                    return foreign
                next_probe = time.monotonic() + PROBE_INTERVAL
            value = self.name_resolve.get(address_key)
            if value is not None:
                info = self.name_resolve.get(
                    name_resolve_keys.worker_info_key(s.experiment, s.trial, role, index)
                )
                meta = json.loads(info) if info else {}
                self._watch(child_id)
                return {"address": value, "pid": proc.pid, **meta}
            if proc.poll() is not None:
                with self._lock:
                    self.children.pop(child_id, None)
                log = replica_log_path(s.log_dir, role, index) if s.log_dir else None
                self._pump.flush_closed()
                raise WorkerCreationError(
                    f"forked worker {child_id} {_describe_end(proc, proc.returncode)} before "
                    f"it registered\n{tail(log)}"
                )
            time.sleep(pause)
            pause = min(pause * 1.5, 0.002 if time.monotonic() - started < 1.0 else 0.01)
        self.kill(child_id)
        raise WorkerCreationError(
            f"forked worker {child_id} did not register"
            + ("" if foreign is None else f" or answer GET /health on port {port}")
            + f" within {timeout}s"
        )

    def _from_template(self, child_env: dict, timeout: float):
        """The child made by this worker's fork template (started on the first fork), or
        None where the template cannot make it (an interpreter variable differs, the
        template failed): then it is spawned as a fresh process."""
        from corral.worker.fork_template import Template

        with self._template_lock:
            for attempt in range(2):  # a template found dead on the way is replaced once
                template = self._template
                if template is None or not template.alive:
                    try:
                        template = self._template = Template(dict(os.environ), spawn)
                    except OSError as exc:
                        warn("corral: no fork template (%s); forks start fresh processes", exc)
                        return None
                if not template.fits(child_env):
                    return None
                try:
                    return template.fork(child_env, self._secret, timeout)
                except OSError as exc:
                    if attempt == 0 and not template.alive and not isinstance(exc, TimeoutError):
                        continue  # found dead on the way (a hung one was given its time)
                    warn("corral: fork template failed (%s); starting a fresh process", exc)
            return None

    def _spawn(self, argv: list[str], child_env: dict) -> subprocess.Popen:
        """A fresh process; the secret reaches it through a pipe, never its environment."""
        read_end, write_end = os.pipe()
        try:
            child_env[E.SECRET_FD] = str(read_end)
            return spawn(argv, child_env, pass_fds=(read_end,))
        finally:
            os.close(read_end)
            try:
                with os.fdopen(write_end, "w") as fh:  # 64 bytes: fits the pipe buffer
                    fh.write(self._secret)
            except BrokenPipeError:
                pass  # the child is gone already; reported by the caller

    def _watch(self, child_id: str) -> None:
        """Publish the child's death if it dies alone (not stopped by ``kill``)."""
        with self._lock:
            child = self.children[child_id]
        threading.Thread(
            target=self._await_exit, args=(child_id, child), name=f"corral-fork-{child_id}",
            daemon=True,
        ).start()  # fmt: skip

    def _await_exit(self, child_id: str, child: Child) -> None:
        """Block until the child exits without reaping it (so ``Popen``'s own lock is never
        held while waiting), then reap it and, unless ``kill`` stopped it, write its death
        where the controller's live view and ``corral ps`` read deaths: the signed record
        ``<exp>/<trial>/_health/<role>/<index>``, with its exit code and pid."""
        if isinstance(child.proc, subprocess.Popen):  # a template's child: not ours to wait
            try:
                os.waitid(os.P_PID, child.proc.pid, os.WEXITED | os.WNOWAIT)
            except ChildProcessError:
                pass  # already reaped (kill)
        code = child.proc.wait()
        with self._lock:
            if self.children.get(child_id) is not child:
                return  # stopped on request: not a failure
        self._pump.flush_closed()  # its last lines are in its log before it shows failed
        s = self.settings
        record = {
            "worker_id": child_id,
            "state": "dead",
            "reason": f"forked worker {_describe_end(child.proc, code)}",
            "exit_code": code,
            "at": time.time(),
            "run_id": s.run_id,
            "pid": child.proc.pid,
        }
        try:
            self.name_resolve.add(
                name_resolve_keys.worker_health_key(s.experiment, s.trial, child.role, child.index),
                json.dumps(record),
                replace=True,
            )
        except Exception as exc:
            warn("could not record the death of forked worker %s: %s", child_id, exc)

    def kill(self, child_id: str, grace: float = 3.0) -> bool:
        """Stop child ``child_id``; one still being spawned is stopped once it is."""
        with self._lock:
            child = self.children.pop(child_id, None)
            if child is None and child_id in self._starting:
                self._starting[child_id] = True
        if child is None:
            return False
        stop_process_groups([child.proc], grace)
        s = self.settings
        self.name_resolve.delete(
            name_resolve_keys.worker_address_key(s.experiment, s.trial, child.role, child.index)
        )
        self.name_resolve.delete(
            name_resolve_keys.worker_info_key(s.experiment, s.trial, child.role, child.index)
        )
        return True

    def kill_all(self) -> None:
        for child_id in list(self.children):
            self.kill(child_id)
        with self._template_lock:
            if self._template is not None:
                self._template.stop()
                self._template = None


def _describe_end(proc, code: int) -> str:
    """How a forked child ended, in words (a template's child whose template exited
    first has no known code)."""
    if getattr(proc, "code_unknown", False):
        return "ended after its fork template exited (exit code unknown)"
    return describe_returncode(code)
