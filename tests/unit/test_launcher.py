"""The Launcher interface: small, one question per method, the shared defaults (fork
through the target worker, no restart), and what each backend declares about itself.
Backends are imported, not started (no Ray runtime, no Slurm cluster needed)."""

from __future__ import annotations

import inspect

from corral.backends.local import LocalLauncher
from corral.backends.ray.launcher import RayLauncher
from corral.backends.slurm.launcher import SlurmLauncher
from corral.launcher import ForkRequest, Launcher, LaunchRequest, can_restart
from corral.spec import Worker

MAX_METHODS = 14  # the 13 questions below plus progress  # public methods of the interface (issue 14: "a small interface")


def _methods(cls: type) -> dict[str, object]:
    return {
        name: member
        for name, member in vars(cls).items()
        if inspect.isfunction(member) and not name.startswith("_")
    }


def test_only_launch_poll_and_stop_must_be_written():
    assert Launcher.__abstractmethods__ == frozenset({"launch", "poll", "stop"})


def test_the_interface_is_small_and_each_method_says_its_question():
    methods = _methods(Launcher)
    assert len(methods) <= MAX_METHODS, sorted(methods)
    for name, fn in methods.items():
        doc = inspect.getdoc(fn)
        assert doc, f"Launcher.{name} has no docstring"


def test_a_launch_request_carries_only_what_launch_reads():
    assert list(LaunchRequest.__dataclass_fields__) == ["job", "envs", "log_dir"]


def _backend_methods(cls: type) -> dict[str, object]:
    """The public methods a backend writes, in its class and in the mixins it is made of
    (its capability modules, e.g. ray_fork.RayForks)."""
    found: dict[str, object] = {}
    for klass in reversed(cls.__mro__):
        if klass.__module__.startswith("corral.backends."):
            found.update(_methods(klass))
    return found


def test_backends_override_only_interface_methods():
    public = set(_methods(Launcher)) | {"progress"}
    for cls in (LocalLauncher, RayLauncher, SlurmLauncher):
        overridden = {n for n in _backend_methods(cls) if hasattr(Launcher, n)}
        assert overridden <= public, (cls.__name__, overridden - public)


def test_backend_mixins_are_seen_by_the_override_check():
    # RayLauncher's fork, stop and pending_reason are written in its mixins
    assert {"fork", "stop", "pending_reason", "close"} <= set(_backend_methods(RayLauncher))


def test_restart_support_and_filesystem_are_declared():
    assert can_restart(LocalLauncher(gpu_devices=[]))
    assert can_restart(RayLauncher(dry_run=True))
    assert can_restart(SlurmLauncher(n_gpus_per_node=0, dry_run=True))
    assert LocalLauncher.shares_filesystem and SlurmLauncher.shares_filesystem
    assert not RayLauncher.shares_filesystem  # the secret travels as an actor argument


class _Minimal(Launcher):
    """The least a backend writes."""

    def launch(self, request):
        pass

    def poll(self, role):
        return {}

    def stop(self, role, reverse=False):
        pass


def test_the_default_fork_and_stop_fork_go_through_the_target_worker():
    target = Worker(id="t/0", ip="127.0.0.1", worker_ports=["1", "2"], engine_ports=[])
    made = Worker(id="c/0", ip="127.0.0.1", worker_ports=["3", "4"], engine_ports=[])
    calls = []
    launcher = _Minimal()

    def via_worker():
        calls.append("fork")
        return made

    assert launcher.fork(ForkRequest("c", 0, target, {}, None, via_worker)) is made
    launcher.stop_fork(made, lambda: calls.append("stop"))
    assert calls == ["fork", "stop"]
    assert not can_restart(launcher)
    assert launcher.rendezvous_master("t", [target]) == ("127.0.0.1", 2)
