"""A worker's forked children come from its fork template (corral.worker.fork_template):
one process per forking worker that imported the worker once and makes each child with
``os.fork``. Real worker processes throughout; the worker is asked over its RPC as the
controller asks it (``POST /fork``)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from corral.discovery.files import FileNameResolve
from corral.discovery.signed import SignedNameResolve
from corral.errors import CorralError
from corral.name_resolve_keys import worker_health_key
from corral.paths import replica_log_path
from corral.procs import spawn
from corral.rpc.client import RPCClient
from corral.worker.fork_template import Template
from tests.support.standalone_worker import standalone_worker_env

SECRET = "s" * 64


@contextlib.contextmanager
def _worker(tmp_path):
    """A registered worker: yields its pid and address."""
    env = standalone_worker_env(
        tmp_path,
        "tmpl",
        lease_timeout=600.0,  # longer than any wait here: no child stops on its own
        parent_pid=os.getpid(),
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "corral.worker"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        for raw in proc.stdout:
            line = raw.decode(errors="replace")
            if "serving at" in line:
                yield proc.pid, line.split("serving at ", 1)[1].split()[0]
                return
        raise AssertionError("the worker ended before it registered")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()


def _fork(address: str, role: str, env: dict | None = None) -> dict:
    return RPCClient(SECRET).request(
        address,
        "/fork",
        {"role": role, "index": 0, "module": None, "env": env or {}, "timeout": 60},
        timeout=90,
    )


def _wait_for_line(path: str, line: str) -> bool:
    """Has ``line`` reached the log at ``path`` (the worker's log pump writes it a moment
    after the child printed it)?"""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if os.path.exists(path) and line in open(path).read():
            return True
        time.sleep(0.05)
    return False


def _parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[1])


def _environ_of(address: str) -> dict[str, str]:
    """The forked child's ``os.environ``, asked of an engine in it (a forked child's
    /proc/PID/environ is the template's, from before the fork)."""
    client = RPCClient(SECRET)
    client.request(address, "/create_engine", {"engine": "corral.testing.engines.EchoEngine"})
    call = {"engine_name": None, "method": "environ", "args": [], "kwargs": {}}
    return client.request(address, "/call", call)


def _cmdline_of(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as fh:
        return fh.read().replace(b"\0", b" ").decode()


def test_children_are_forked_from_one_template_with_their_own_environment(tmp_path):
    """Two children of one worker: both are children of the same template process (a
    ``corral.worker.template_process``, itself the worker's child), each registered under
    its own role with the job environment it was given."""
    with _worker(tmp_path) as (worker_pid, address):
        first = _fork(address, "a", {"JOB_VAR": "one"})
        second = _fork(address, "b", {"JOB_VAR": "two"})
        template = _parent_of(first["pid"])
        assert _parent_of(second["pid"]) == template
        assert _parent_of(template) == worker_pid
        assert "corral.worker.template_process" in _cmdline_of(template)
        for reply, role, value in ((first, "a", "one"), (second, "b", "two")):
            environ = _environ_of(reply["address"])
            assert (environ["CORRAL_ROLE"], environ["JOB_VAR"]) == (role, value)
            assert "CORRAL_SECRET_FILE" not in environ and "CORRAL_SECRET" not in environ
        assert first["address"] != second["address"]
        # each child's output goes to its own log (the pipe the worker gave the template)
        line = f"corral worker b/0 serving at {second['address']}"
        assert _wait_for_line(replica_log_path(str(tmp_path / "logs"), "b", 0), line)


def test_a_child_with_another_interpreter_variable_is_a_fresh_process(tmp_path):
    """A ``PYTHON*`` variable the template's interpreter did not start with: the child is
    spawned by the worker itself, as ``python -m corral.worker``."""
    with _worker(tmp_path) as (worker_pid, address):
        _fork(address, "a")  # the template exists
        reply = _fork(address, "b", {"PYTHONHASHSEED": "123"})
        assert _parent_of(reply["pid"]) == worker_pid
        assert "template_process" not in _cmdline_of(reply["pid"])


def test_a_template_child_that_dies_before_registering_is_reported_with_its_code(tmp_path):
    """A child that exits before it registers fails the fork with its exit code (the
    template reports it), not with "did not register within" after the timeout."""
    with _worker(tmp_path) as (_pid, address):
        _fork(address, "a")  # the template exists: the next child is its
        with pytest.raises(CorralError) as failure:
            _fork(address, "b", {"CORRAL_PORT_COUNT": "many"})  # not a number
    text = str(failure.value)
    assert "exited with code 1 before it registered" in text, text


def test_a_killed_template_is_replaced_on_the_next_fork(tmp_path):
    """The template killed from outside: the next fork still succeeds (a new template),
    and the children of the killed one stop with it (their parent-death signal). Their
    death record says their exit code is unknown (no parent was left to read it), not a
    made-up signal."""
    records = SignedNameResolve(FileNameResolve(str(tmp_path / "records")), SECRET)
    with _worker(tmp_path) as (worker_pid, address):
        first = _fork(address, "a")
        template = _parent_of(first["pid"])
        os.kill(template, signal.SIGKILL)
        second = _fork(address, "b")
        assert _parent_of(second["pid"]) not in (template, worker_pid)
        assert _parent_of(_parent_of(second["pid"])) == worker_pid
        death = _wait_for_record(records, worker_health_key("tmpl", "t0", "a", 0))
    assert json.loads(death)["reason"] == (
        "forked worker ended after its fork template exited (exit code unknown)"
    ), death


def _wait_for_record(records, key: str) -> str:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        value = records.get(key)
        if value is not None:
            return value
        time.sleep(0.05)
    raise AssertionError(f"no record at {key} within 60 s")


def _gone(pid: int) -> bool:
    """Has ``pid`` exited (waited up to a minute; a zombie counts as exited)?"""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_a_killed_worker_takes_its_template_and_the_templates_children_along(tmp_path):
    """SIGKILL to the worker (no cleanup of its own): the template's parent-death signal
    stops it, and the children's stops them; no process is left behind."""
    with _worker(tmp_path) as (_pid, address):
        child = _fork(address, "a")["pid"]
        template = _parent_of(child)
    assert _gone(template), "the fork template outlived its worker"
    assert _gone(child), "a forked child outlived its worker and template"


def _open_pipes() -> set[str]:
    """This process's descriptors that are pipes (``pipe:[inode]``)."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("pipe:"):
            found.add(target)
    return found


def test_a_template_that_answers_too_late_is_stopped_and_nothing_of_the_request_is_left():
    """A template that does not answer a fork in time (here: stopped with SIGSTOP) fails
    that fork with TimeoutError and is stopped, so its late answer and late child can never
    be handed to a later fork; the request's pipe ends are closed."""
    template = Template(dict(os.environ), spawn)
    try:
        before = _open_pipes()
        os.kill(template.proc.pid, signal.SIGSTOP)
        with pytest.raises(TimeoutError):
            template.fork(dict(os.environ), SECRET, 1.0)
        assert not template.alive
        assert not template.fits(dict(os.environ))  # the next fork makes a new template
        assert template.proc.poll() is not None, "the late template lives on"
        assert _open_pipes() <= before, "the timed-out request left its pipe open"
    finally:
        template.stop()
