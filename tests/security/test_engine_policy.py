"""Attack 1, second half: with the secret, ``/create_engine os.system`` ran a shell
command. The engine policy refuses command runners; ``/fork`` refuses stdlib modules."""

from __future__ import annotations

import asyncio

import pytest

from corral import Job, SchedulingSpec
from corral.errors import EngineImportError, SchedulerError

COMMAND_RUNNERS = [
    "os.system", "posix.system", "os.popen", "os.execv", "subprocess.Popen",
    "subprocess.run", "subprocess.check_output", "builtins.eval", "builtins.exec",
    "pty.spawn", "shutil.rmtree", "corral.procs.spawn", "corral.worker.fork.ForkManager",
]  # fmt: skip


@pytest.fixture
def worker(sched):
    (wid,) = sched.create_workers(Job(role="eng", replicas=1))
    return wid


@pytest.mark.parametrize("path", COMMAND_RUNNERS)
def test_command_runner_is_refused_as_engine(sched, worker, tmp_path, path) -> None:
    marker = tmp_path / "pwned"
    with pytest.raises(
        EngineImportError, match="(?s)engine import path .*(policy|not a class|corral's own)"
    ):
        asyncio.run(sched.create_engine(worker, path, "x", f"touch {marker}"))
    assert not marker.exists()
    assert sched.health(worker)["engines"] == []


def test_engine_allow_option_admits_a_listed_path(sched) -> None:
    spec = SchedulingSpec(cpu=1, env_vars={"CORRAL_ENGINE_ALLOW": "collections.Counter"})
    (wid,) = sched.create_workers(Job(role="allowed", replicas=1, tasks=[spec]))
    asyncio.run(sched.create_engine(wid, "collections.Counter", "c"))
    assert sched.call_engine(wid, "total", "c") == 0
    with pytest.raises(EngineImportError, match="standard library"):
        asyncio.run(sched.create_engine(wid, "collections.OrderedDict", "d"))


def test_user_engine_class_is_still_allowed(sched, worker) -> None:
    asyncio.run(sched.create_engine(worker, "corral.testing.engines.EchoEngine", "e"))
    assert sched.call_engine(worker, "echo", "e", 5) == 5


@pytest.mark.parametrize("module", ["http.server", "pydoc", "code", "venv"])
def test_fork_of_a_standard_library_module_is_refused(sched, worker, module) -> None:
    with pytest.raises(SchedulerError, match=f"(?s)fork.command.*{module}.*standard-library"):
        sched.fork_workers("forked", "eng", command=module)
    assert sched.health(worker)["forked_children"] == []
