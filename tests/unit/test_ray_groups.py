"""The Ray backend's pure pieces, without a Ray runtime: which placement groups a role
asks for (launch and grow, every strategy; the names a dead run's groups are found by),
an actor's accelerator share, a dry run printing the same groups, and the launcher made
of parts that share one state."""

from __future__ import annotations

from corral.backends.ray.bundles import accelerator_options
from corral.backends.ray.groups import group_specs
from corral.backends.ray.launcher import RayLauncher
from corral.capabilities import Adoptable, Elastic, Preemptible
from corral.launcher import Launcher, LaunchRequest
from corral.spec import NormalizedJob, SchedulingSpec, SchedulingStrategy
from corral.worker import env as E

ONE, TWO = {"CPU": 1.0}, {"CPU": 2.0}


def test_shared_is_one_pack_group_for_the_role_and_one_per_growth():
    assert group_specs("p", "r", [ONE, TWO], "shared") == [([ONE, TWO], "PACK", "p:r")]
    assert group_specs("p", "r", [ONE], "shared", first=3) == [([ONE], "PACK", "p:r:+3")]


def test_separate_and_deferred_are_one_spread_group_per_worker_named_by_index():
    assert group_specs("p", "r", [ONE, TWO], "separate") == [
        ([ONE], "SPREAD", "p:r:0"),
        ([TWO], "SPREAD", "p:r:1"),
    ]
    assert group_specs("p", "r", [ONE, TWO], "deferred", first=2) == [
        ([ONE], "SPREAD", "p:r:2"),
        ([TWO], "SPREAD", "p:r:3"),
    ]


def test_a_single_gpu_leaves_room_for_forks_and_several_are_taken_whole():
    assert accelerator_options("GPU", 1) == {"num_gpus": 0.9}
    assert accelerator_options("GPU", 2) == {"num_gpus": 2.0}
    assert accelerator_options("NPU", 1) == {"resources": {"NPU": 0.9}}
    assert accelerator_options(None, 1) == {} and accelerator_options("GPU", 0) == {}


def test_a_dry_run_prints_the_groups_launch_would_create():
    tasks = (SchedulingSpec(cpu=1, gpu=1, mem=1), SchedulingSpec(cpu=1, gpu=1, mem=1))
    job = NormalizedJob("r", 2, tasks, SchedulingStrategy())
    envs = [{E.EXPERIMENT: "e", E.TRIAL: "t", E.INDEX: str(i)} for i in range(2)]
    text = RayLauncher(dry_run=True).describe(LaunchRequest(job, envs, "/logs"))
    bundle = {"CPU": 1.0, "GPU": 1.0}
    for _, strategy, name in group_specs("corral:e:t", "r", [bundle, bundle], "separate"):
        assert f"placement_group([{bundle}], strategy='{strategy}', name='{name}')" in text
    assert "'num_gpus': 0.9" in text


def test_the_launcher_is_made_of_parts_that_share_one_state():
    launcher = RayLauncher(dry_run=True)
    assert RayLauncher.__bases__ == (Launcher,)  # no mixins
    assert isinstance(launcher.elastic, Elastic)
    assert isinstance(launcher.preemption, Preemptible)
    assert isinstance(launcher.adoption, Adoptable)
    assert launcher.multi_node is True
    parts = [launcher.elastic, launcher.preemption, launcher.adoption, launcher.actors]
    parts += [launcher.groups, launcher.teardown, launcher.forks, launcher.polls]
    assert all(part.state is launcher.state for part in parts)
    # the scheduler sets these on the launcher after making it: the parts must see them
    launcher.outlive, launcher.trial_secret, launcher.n_gpus_per_node = 5.0, "s", 8
    launcher.startup_timeout = 7.0
    seen = launcher.state
    assert (seen.outlive, seen.trial_secret, seen.n_gpus_per_node) == (5.0, "s", 8)
    assert seen.startup_timeout == 7.0
    said = []
    launcher.progress = said.append
    launcher.state.progress("waiting")
    assert said == ["waiting"]
