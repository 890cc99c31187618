"""sbatch rendering: golden scripts and every ConfigError shape, without a process (the
scripts run by bash: tests/integration/test_sbatch_scripts_run.py; the rendered script as a
real Slurm job: tests/slurm/test_sbatch_on_slurm.py).

Golden files live in tests/unit/golden/sbatch_*.sh. After an intended change to the
renderer, rewrite them with ``CORRAL_UPDATE_GOLDEN=1 python -m pytest tests/unit/test_sbatch.py``
and review the diff.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

import pytest

from corral.backends.backend_options import SlurmOptions
from corral.backends.slurm.batch_params import RESERVED_ENV, SbatchParams, check_container
from corral.backends.slurm.batch_script import render_sbatch_script, render_task_script
from corral.backends.slurm.job_files import exit_code_path, sbatch_log_path
from corral.backends.slurm.layout import check_homogeneous, plan_layout
from corral.errors import ConfigError
from corral.paths import merged_log_path, replica_log_path, role_log_path
from corral.spec import SchedulingSpec

GOLDEN_DIR = Path(__file__).parent / "golden"
UPDATE_GOLDEN = os.environ.get("CORRAL_UPDATE_GOLDEN") == "1"


def make_params(**overrides) -> SbatchParams:
    base = dict(
        job_name="demo_run1_trainer",
        role="trainer",
        replicas=2,
        spec=SchedulingSpec(cpu=2, gpu=0, mem=4),
        n_gpus_per_node=8,
        log_dir="/shared/corral/demo/run1/logs",
        experiment="demo",
        trial="run1",
        name_resolve={"type": "files", "root": "/shared/corral/name_resolve"},
        secret_file="/shared/corral/demo/run1/.secret",
        python="/opt/venv/bin/python",
    )
    renamed = {"extra_sbatch_directives": "sbatch_directives", "extra_srun_args": "srun_args",
               "mount": "container_mounts"}  # fmt: skip
    options = {}
    for key in list(overrides):
        name = renamed.get(key, key)
        if name in SlurmOptions.names():
            options[name] = overrides.pop(key)
    base.update(overrides)
    return SbatchParams(**base, options=SlurmOptions(**options))


def assert_golden(name: str, text: str) -> None:
    path = GOLDEN_DIR / f"sbatch_{name}.sh"
    if UPDATE_GOLDEN:
        GOLDEN_DIR.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return
    assert path.exists(), f"{path} missing: run with CORRAL_UPDATE_GOLDEN=1 to create it"
    expected = path.read_text()
    assert text == expected, (
        f"rendered script differs from {path}; if the change is intended, rerun with "
        "CORRAL_UPDATE_GOLDEN=1 and review the diff"
    )


GOLDEN_CASES = {
    "cpu_only": lambda: make_params(
        replicas=2,
        spec=SchedulingSpec(cpu=2, gpu=0, mem=4, env_vars={"OMP_NUM_THREADS": "2"}),
    ),
    "gpu_4x1_2nodes": lambda: make_params(
        role="rollout",
        job_name="demo_run1_rollout",
        replicas=4,
        spec=SchedulingSpec(cpu=4, gpu=1, mem=16, port_count=2),
        n_gpus_per_node=2,
    ),
    "gpu_2x2": lambda: make_params(
        replicas=2,
        spec=SchedulingSpec(cpu=8, gpu=2, mem=32),
        n_gpus_per_node=4,
        env={"NCCL_DEBUG": "WARN"},
    ),
    "apptainer": lambda: make_params(
        replicas=2,
        spec=SchedulingSpec(
            cpu=4,
            gpu=1,
            mem=8,
            container_type="apptainer",
            image="/shared/images/train.sif",
            mount="/shared:/shared,/scratch",
            additional_bash_cmds=["module load cuda/12.4", "export HF_HOME=/scratch/hf"],
        ),
        python="python3",
    ),
    "directives": lambda: make_params(
        replicas=3,
        spec=SchedulingSpec(
            cpu=1,
            gpu=1,
            mem=2,
            nodelist="gpu[01-02]",
            srun_additional_args="--mpi=none --label",
            cmd="/opt/venv/bin/python -m corral.worker --log-level 'debug info'",
        ),
        n_gpus_per_node=2,
        partition="gpu",
        account="proj42",
        qos="high",
        time_limit="1-12:00:00",
        extra_sbatch_directives=["--reservation=rl-week", "--constraint=h100"],
        extra_srun_args=["--cpu-bind=cores"],
        exclude="gpu07",
        index_offset=4,
        lease_timeout=12.5,
        env={"WANDB_MODE": "offline", "QUOTED": 'it\'s a "value" with $dollar'},
        name_resolve='{"type": "etcd", "address": "10.0.0.5:2379"}',
    ),
    "heterogeneous": lambda: make_params(
        role="actor",
        job_name="demo_run1_actor",
        replicas=4,
        spec=SchedulingSpec(
            cpu=4,
            gpu=2,
            mem=16,
            partition="b200",
            constraint="b200&ib",
            reservation="rl-week",
            exclusive=True,
        ),
        n_gpus_per_node=8,
        partition="a100",  # the scheduler's partition: the spec's wins
    ),
    "multinode_2x8": lambda: make_params(
        role="server",
        job_name="demo_run1_server",
        replicas=2,
        spec=SchedulingSpec(cpu=16, gpu=16, mem=64),
        n_gpus_per_node=8,
    ),
}


# ----------------------------------------------------------------- golden files --
@pytest.mark.parametrize("name", sorted(GOLDEN_CASES))
def test_golden(name):
    params = GOLDEN_CASES[name]()
    script = render_sbatch_script(params)
    assert_golden(name, script)


def test_golden_files_have_no_stale_extras():
    names = {p.name for p in GOLDEN_DIR.glob("sbatch_*.sh")}
    assert names == {f"sbatch_{n}.sh" for n in GOLDEN_CASES}


def test_rendering_is_deterministic():
    for make in GOLDEN_CASES.values():
        assert render_sbatch_script(make()) == render_sbatch_script(make())


# ---------------------------------------------------------------------- layout --
@pytest.mark.parametrize(
    "replicas, gpu, per_node, nodes, tasks_per_node, gres",
    [
        (2, 0, 8, 1, 2, 0),  # CPU-only: one node
        (64, 0, 0, 1, 64, 0),  # CPU-only, no GPUs on the cluster at all
        (4, 1, 2, 2, 2, 2),
        (2, 2, 4, 1, 2, 4),
        (2, 2, 2, 2, 1, 2),
        (3, 1, 2, 2, 2, 2),  # uneven but within the node: 2 + 1
        (16, 1, 8, 2, 8, 8),
        (1, 8, 8, 1, 1, 8),
        (3, 3, 4, 3, 1, 3),
    ],
)
def test_plan_layout(replicas, gpu, per_node, nodes, tasks_per_node, gres):
    layout = plan_layout(replicas, SchedulingSpec(gpu=gpu, mem=3), per_node)
    assert (layout.nodes, layout.ntasks_per_node, layout.gpus_per_node) == (
        nodes,
        tasks_per_node,
        gres,
    )
    assert layout.ntasks == replicas
    assert layout.mem_per_node_gb == 3 * tasks_per_node


def test_header_lines_match_layout():
    script = render_sbatch_script(GOLDEN_CASES["gpu_4x1_2nodes"]())
    directives = re.findall(r"^#SBATCH (\S+)$", script, re.M)
    for d in (
        "--nodes=2",
        "--ntasks=4",
        "--ntasks-per-node=2",
        "--cpus-per-task=4",
        "--mem=32G",
        "--gres=gpu:2",
        "--no-requeue",
        "--job-name=demo_run1_rollout",
        "--output=/shared/corral/demo/run1/logs/rollout.sbatch.log",
        "--error=/shared/corral/demo/run1/logs/rollout.sbatch.log",
    ):
        assert d in directives
    srun = [line for line in script.splitlines() if line.startswith("srun ")]
    assert len(srun) == 1
    for arg in ("--ntasks=4", "--ntasks-per-node=2", "--cpus-per-task=4", "--kill-on-bad-exit=1"):
        assert arg in srun[0].split()


def _srun_words(script: str) -> list[str]:
    (line,) = [line for line in script.splitlines() if line.startswith("srun ")]
    return line.split()


def test_fail_fast_by_default_kills_the_step_on_a_bad_exit():
    for make in GOLDEN_CASES.values():
        params = make()
        assert params.spec.max_restarts == 0
        assert "--kill-on-bad-exit=1" in _srun_words(render_sbatch_script(params))


@pytest.mark.parametrize("max_restarts", [1, 3])
def test_restartable_role_keeps_its_other_tasks_on_a_bad_exit(max_restarts):
    spec = SchedulingSpec(cpu=2, gpu=0, mem=4, max_restarts=max_restarts)
    words = _srun_words(render_sbatch_script(make_params(spec=spec)))
    assert "--kill-on-bad-exit=1" not in words
    # explicit, so that a site's KillOnBadExit=1 does not take the other replicas down
    assert "--kill-on-bad-exit=0" in words


def test_cpu_zero_and_mem_zero():
    script = render_sbatch_script(make_params(spec=SchedulingSpec(cpu=0, gpu=0, mem=0)))
    assert "#SBATCH --cpus-per-task=1" in script
    assert "--mem" not in script
    assert "--gres" not in script


def test_environment_exports():
    script = render_sbatch_script(GOLDEN_CASES["directives"]())
    srun_at = script.index("\nsrun ")
    head = script[:srun_at]
    for line in (
        "export CORRAL_EXPERIMENT=demo",
        "export CORRAL_TRIAL=run1",
        "export CORRAL_ROLE=trainer",
        'export CORRAL_NAME_RESOLVE=\'{"type": "etcd", "address": "10.0.0.5:2379"}\'',
        "export CORRAL_SECRET_FILE=/shared/corral/demo/run1/.secret",
        "export CORRAL_INDEX_OFFSET=4",
        "export CORRAL_LEASE_TIMEOUT=12.5",
        "export WANDB_MODE=offline",
    ):
        assert line + "\n" in head
    # per task, not per job: the task script exports it from SLURM_PROCID
    assert "CORRAL_INDEX=" not in head
    assert 'export CORRAL_INDEX="$corral_index"\n' in script[srun_at:]


def test_env_var_names_match_the_worker_contract():
    env = pytest.importorskip("corral.worker.env")
    for name in (
        "EXPERIMENT",
        "TRIAL",
        "ROLE",
        "NAME_RESOLVE",
        "SECRET_FILE",
        "INDEX_OFFSET",
        "LEASE_TIMEOUT",
        "PORT_COUNT",
        "LOG_DIR",
        "BACKEND_ID",
        "INDEX",
        "SECRET",
    ):
        assert getattr(env, name) in RESERVED_ENV


def test_log_paths():
    assert replica_log_path("/l/", "actor", 3) == "/l/actor/3.log"
    assert role_log_path("/l", "actor") == "/l/actor.log"
    assert merged_log_path("/l") == "/l/merged.log"
    assert sbatch_log_path("/l", "actor") == "/l/actor.sbatch.log"
    assert exit_code_path("/l", "actor", 3) == "/l/actor/3.exit"
    assert exit_code_path("/l", "actor", 3, "41") == "/l/actor/3.41.exit"


def test_overrides_take_precedence_over_spec():
    spec = SchedulingSpec(nodelist="a1", exclude="a2")
    script = render_sbatch_script(make_params(spec=spec, nodelist="b1", exclude="b2"))
    assert "#SBATCH --nodelist=b1" in script and "#SBATCH --exclude=b2" in script
    script = render_sbatch_script(make_params(spec=spec))
    assert "#SBATCH --nodelist=a1" in script and "#SBATCH --exclude=a2" in script


def test_time_limit_minutes_int():
    assert "#SBATCH --time=90\n" in render_sbatch_script(make_params(time_limit=90))


# ---------------------------------------------------------------- ConfigErrors --
def assert_config_error(fn, field: str, *fragments: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        fn()
    err = info.value
    assert err.field == field, str(err)
    for fragment in fragments:
        assert fragment in str(err), str(err)
    return err


def test_gpu_more_than_a_node():
    err = assert_config_error(
        lambda: render_sbatch_script(make_params(spec=SchedulingSpec(gpu=3), n_gpus_per_node=2)),
        "SchedulingSpec.gpu",
        "n_gpus_per_node=2",
    )
    assert err.value == 3


def test_a_multinode_spec_whose_cpu_does_not_divide_is_refused():
    err = assert_config_error(
        lambda: render_sbatch_script(
            make_params(spec=SchedulingSpec(gpu=16, cpu=3), n_gpus_per_node=8)
        ),
        "SchedulingSpec.cpu",
        "3 % 2 = 1",
    )
    assert err.value == 3


def test_gpu_on_a_cluster_without_gpus():
    assert_config_error(
        lambda: plan_layout(1, SchedulingSpec(gpu=1), 0), "SchedulingSpec.gpu", "n_gpus_per_node=0"
    )


def test_replicas_that_do_not_pack():
    # 5 x 3 GPUs on 8-GPU nodes: 2 nodes, 3 per node = 9 GPUs > 8
    err = assert_config_error(
        lambda: plan_layout(5, SchedulingSpec(gpu=3), 8),
        "job.replicas",
        "multiple of 2 replicas",
        "4 or 6",
    )
    assert err.value == 5


@pytest.mark.parametrize("replicas", [0, -1, True, 1.5])
def test_bad_replicas(replicas):
    assert_config_error(lambda: plan_layout(replicas, SchedulingSpec(), 8), "job.replicas")


@pytest.mark.parametrize("n", [-1, True, "8"])
def test_bad_n_gpus_per_node(n):
    assert_config_error(lambda: plan_layout(1, SchedulingSpec(), n), "n_gpus_per_node")


def test_cpus_per_node_exceeded():
    assert_config_error(
        lambda: render_sbatch_script(
            make_params(replicas=4, spec=SchedulingSpec(cpu=2), n_cpus_per_node=4)
        ),
        "SchedulingSpec.cpu",
        "cpu <= 1",
    )


def test_mem_per_node_exceeded():
    assert_config_error(
        lambda: plan_layout(2, SchedulingSpec(mem=40), 8, mem_per_node_gb=64),
        "SchedulingSpec.mem",
        "mem <= 32",
    )


def test_check_homogeneous():
    a = SchedulingSpec(cpu=2, gpu=1)
    assert check_homogeneous([a, SchedulingSpec(cpu=2, gpu=1)]) is a
    # a Ray-only field may differ
    check_homogeneous([a, SchedulingSpec(cpu=2, gpu=1, ray_placement_strategy="shared")])
    err = assert_config_error(
        lambda: check_homogeneous([a, a, SchedulingSpec(cpu=2, gpu=2)]),
        "job.tasks[2].gpu",
        "tasks[0].gpu=1",
        "same spec",
    )
    assert err.value == 2
    assert_config_error(
        lambda: check_homogeneous([a, SchedulingSpec(cpu=2, gpu=1, env_vars={"X": "1"})]),
        "job.tasks[1].env_vars",
    )
    assert_config_error(lambda: check_homogeneous([]), "job.tasks")


def test_check_container(tmp_path):
    check_container(SchedulingSpec())  # no container: nothing to check
    image = tmp_path / "img.sif"
    spec = SchedulingSpec(container_type="apptainer", image=str(image))
    assert_config_error(lambda: check_container(spec), "SchedulingSpec.image", "no such file")
    image.write_bytes(b"")
    check_container(spec)
    # overrides on SbatchParams are what gets checked
    params = make_params(container_type="apptainer", image=str(tmp_path / "other.sif"))
    assert_config_error(lambda: check_container(params), "SchedulingSpec.image")
    check_container(make_params(container_type="apptainer", image=str(image)))


def test_apptainer_override_without_image():
    assert_config_error(
        lambda: render_sbatch_script(make_params(container_type="apptainer")),
        "SchedulingSpec.image",
    )


def test_apptainer_wraps_the_command():
    task = render_task_script(GOLDEN_CASES["apptainer"]())
    assert (
        "apptainer exec --nv --bind /shared:/shared,/scratch /shared/images/train.sif "
        "python3 -m corral.worker 3>&- 2>&1" in task
    )


@pytest.mark.parametrize(
    "key, field",
    [
        ("CORRAL_ROLE", "env['CORRAL_ROLE']"),
        ("CORRAL_SECRET", "env['CORRAL_SECRET']"),
        ("CORRAL_INDEX", "env['CORRAL_INDEX']"),
        ("1BAD", "env['1BAD']"),
        ("A-B", "env['A-B']"),
    ],
)
def test_bad_extra_env(key, field):
    assert_config_error(lambda: render_sbatch_script(make_params(env={key: "x"})), field)


def test_env_may_repeat_and_override_corral_values():
    env = {
        "CORRAL_EXPERIMENT": "demo",
        "CORRAL_ROLE": "trainer",
        "CORRAL_LEASE_TIMEOUT": "9",
        "CORRAL_CONTROLLER_HOST": "login1",
        "OMP_NUM_THREADS": "1",
    }
    spec = SchedulingSpec(env_vars={"OMP_NUM_THREADS": "4"})
    script = render_sbatch_script(make_params(env=env, spec=spec))
    exports = [line for line in script.splitlines() if line.startswith("export ")]
    names = [line.split("=", 1)[0] for line in exports]
    assert len(names) == len(set(names))  # one export per variable
    assert "export CORRAL_EXPERIMENT=demo" in exports
    assert "export CORRAL_LEASE_TIMEOUT=9" in exports
    assert "export CORRAL_CONTROLLER_HOST=login1" in exports
    assert "export OMP_NUM_THREADS=4" in exports  # the user's spec wins


def test_reserved_names_refused_in_spec_env():
    spec = SchedulingSpec(env_vars={"CORRAL_TRIAL": "other"})
    assert_config_error(
        lambda: render_sbatch_script(make_params(spec=spec)),
        "SchedulingSpec.env_vars['CORRAL_TRIAL']",
    )


def test_secret_is_refused_in_spec_env():
    spec = SchedulingSpec(env_vars={"CORRAL_SECRET": "hunter2"})
    err = assert_config_error(
        lambda: render_sbatch_script(make_params(spec=spec)),
        "SchedulingSpec.env_vars['CORRAL_SECRET']",
        "secret_file",
    )
    assert "hunter2" not in str(err)


def test_non_str_env_value():
    assert_config_error(lambda: render_sbatch_script(make_params(env={"A": 1})), "env['A']", "str")


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(log_dir="logs"), "log_dir"),
        (dict(log_dir="/a b"), "log_dir"),
        (dict(log_dir="/logs/%j"), "log_dir"),
        (dict(job_name="my job"), "job_name"),
        (dict(job_name=""), "job_name"),
        (dict(partition="a b"), "partition"),
        (dict(account="x\ny"), "account"),
        (dict(qos=""), "qos"),
        (dict(time_limit="soon"), "time_limit"),
        (dict(time_limit=0), "time_limit"),
        (dict(nodelist="n1 n2"), "nodelist"),
        (dict(exclude="n1\n#SBATCH --x"), "exclude"),
        (dict(extra_sbatch_directives=["reservation=x"]), "sbatch_directives[0]"),
        (dict(extra_sbatch_directives=["--a", "--b\n--c"]), "sbatch_directives[1]"),
        (dict(extra_srun_args=[3]), "srun_args"),
        (dict(name_resolve="{not json"), "name_resolve"),
        (dict(name_resolve=42), "name_resolve"),
        (dict(secret_file=""), "secret_file"),
        (dict(experiment=""), "experiment"),
        (dict(index_offset=-1), "index_offset"),
        (dict(lease_timeout=0), "lease_timeout"),
        (dict(lease_timeout="soon"), "lease_timeout"),
        (dict(role="a/b"), "job.role"),
        (dict(python=""), "python"),
        (dict(spec=SchedulingSpec(cmd="python -c 'oops")), "SchedulingSpec.cmd"),
        (dict(spec=SchedulingSpec(cmd="   ")), "SchedulingSpec.cmd"),
        (
            dict(spec=SchedulingSpec(srun_additional_args="--x 'y")),
            "SchedulingSpec.srun_additional_args",
        ),
        (
            dict(spec=SchedulingSpec(additional_bash_cmds=[None])),
            "SchedulingSpec.additional_bash_cmds[0]",
        ),
        (dict(container_type="docker"), "container_type"),
    ],
)
def test_bad_params(overrides, field):
    assert_config_error(lambda: render_sbatch_script(make_params(**overrides)), field)


def test_config_errors_carry_value_and_fix():
    with pytest.raises(ConfigError) as info:
        render_sbatch_script(make_params(time_limit="soon"))
    assert info.value.value == "soon"
    assert "4:00:00" in info.value.fix


def read_lines(path: str) -> list[str]:
    return Path(path).read_text().splitlines()


def test_dataclass_is_frozen():
    params = make_params()
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.replicas = 3  # type: ignore[misc]
