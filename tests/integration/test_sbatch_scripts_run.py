"""The rendered Slurm scripts run by bash, without Slurm: the per-task script's behaviour
and the rendered files' syntax (rendering without a process: tests/unit/test_sbatch.py;
the script as a real Slurm job: tests/slurm/test_sbatch_on_slurm.py)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from corral.backends.slurm.batch_params import SbatchParams
from corral.backends.slurm.batch_script import render_sbatch_script, render_task_script
from corral.backends.slurm.job_files import exit_code_path
from corral.paths import merged_log_path, replica_log_path, role_log_path
from corral.spec import SchedulingSpec
from tests.unit.test_sbatch import GOLDEN_CASES, make_params

BASH = shutil.which("bash")


def bash_syntax_ok(script: str) -> None:
    if BASH is None:
        pytest.skip("bash not available")
    r = subprocess.run([BASH, "-n"], input=script, text=True, capture_output=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("name", sorted(GOLDEN_CASES))
def test_golden_scripts_are_valid_bash(name):
    params = GOLDEN_CASES[name]()
    bash_syntax_ok(render_sbatch_script(params))
    bash_syntax_ok(render_task_script(params))


@pytest.mark.skipif(BASH is None, reason="bash not available")
def test_exported_values_survive_the_shell():
    """Source the export block and read the values back exactly."""
    params = GOLDEN_CASES["directives"]()
    script = render_sbatch_script(params)
    exports = "\n".join(line for line in script.splitlines() if line.startswith("export "))
    probe = exports + '\nprintf "%s\\n" "$QUOTED" "$CORRAL_NAME_RESOLVE" "$CORRAL_BACKEND_ID"'
    r = subprocess.run(
        [BASH, "-c", probe],
        env={"PATH": os.environ["PATH"], "SLURM_JOB_ID": "77"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert r.stdout.splitlines() == [
        'it\'s a "value" with $dollar',
        '{"type": "etcd", "address": "10.0.0.5:2379"}',
        "77",
    ]


# ------------------------------------------------- the per-task script, for real --
def run_task(params: SbatchParams, procid: int, localid: int, **env) -> subprocess.CompletedProcess:
    if BASH is None:
        pytest.skip("bash not available")
    full_env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "SLURM_PROCID": str(procid),
        "SLURM_LOCALID": str(localid),
        **env,
    }
    return subprocess.run(
        [BASH, "-c", render_task_script(params)],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=60,
    )


PRINT_CVD = (
    f"{sys.executable} -c 'import os, sys; "
    'print("cvd=%s" % os.environ.get("CUDA_VISIBLE_DEVICES")); '
    'print("to stderr", file=sys.stderr); '
    'print("foo=%s" % os.environ.get("FOO")); '
    'sys.exit(int(os.environ.get("EXIT_CODE", "0")))\''
)


def task_params(tmp_path: Path, gpu: int, **spec_kwargs) -> SbatchParams:
    spec = SchedulingSpec(cpu=1, gpu=gpu, mem=1, cmd=PRINT_CVD, **spec_kwargs)
    return make_params(
        role="actor", replicas=4, spec=spec, n_gpus_per_node=8, log_dir=str(tmp_path / "logs")
    )


def read_lines(path: str) -> list[str]:
    return Path(path).read_text().splitlines()


def test_task_script_gpus_logs_and_prefixes(tmp_path):
    params = task_params(tmp_path, gpu=2)
    log_dir = params.log_dir
    expected_cvd = {0: "0,1", 1: "2,3", 2: "4,5"}
    for local in (0, 1, 2):
        r = run_task(params, procid=local, localid=local, CORRAL_INDEX_OFFSET="10")
        assert r.returncode == 0, r.stderr
        assert r.stdout == ""  # the worker's output goes only to the log files
        index = 10 + local
        assert read_lines(replica_log_path(log_dir, "actor", index)) == [
            f"cvd={expected_cvd[local]}",
            "to stderr",
            "foo=None",
        ]
    for path in (role_log_path(log_dir, "actor"), merged_log_path(log_dir)):
        lines = read_lines(path)
        assert len(lines) == 9
        for local in (0, 1, 2):
            prefix = f"[actor/{10 + local}] "
            assert f"{prefix}cvd={expected_cvd[local]}" in lines
            assert f"{prefix}to stderr" in lines


def test_task_script_index_offset_defaults_to_zero(tmp_path):
    params = task_params(tmp_path, gpu=1)
    r = run_task(params, procid=3, localid=1)
    assert r.returncode == 0, r.stderr
    assert read_lines(replica_log_path(params.log_dir, "actor", 3))[0] == "cvd=1"


def test_task_script_tells_the_worker_its_index_and_node_in_corral_variables(tmp_path):
    """The worker reads no Slurm variable: the task script exports CORRAL_INDEX
    (offset + SLURM_PROCID) and CORRAL_NODE (SLURMD_NODENAME), and the worker's settings
    and node name come from those."""
    probe = (
        f"{sys.executable} -c 'from corral.worker import env; "
        "print(env.WorkerSettings.from_env().index, env.node_name())'"
    )
    spec = SchedulingSpec(cpu=1, gpu=0, mem=1, cmd=probe)
    params = make_params(
        role="actor", replicas=4, spec=spec, n_gpus_per_node=8, log_dir=str(tmp_path / "logs")
    )
    corral_env = {
        "CORRAL_EXPERIMENT": "e",
        "CORRAL_TRIAL": "t",
        "CORRAL_ROLE": "actor",
        "CORRAL_NAME_RESOLVE": "{}",
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
    }
    r = run_task(
        params, procid=2, localid=0, CORRAL_INDEX_OFFSET="10", SLURMD_NODENAME="n7", **corral_env
    )
    assert r.returncode == 0, r.stderr
    assert read_lines(replica_log_path(params.log_dir, "actor", 12)) == ["12 n7"]


def test_task_script_cpu_only_hides_gpus(tmp_path):
    params = task_params(tmp_path, gpu=0)
    r = run_task(params, procid=1, localid=1, CUDA_VISIBLE_DEVICES="0,1,2,3")
    assert r.returncode == 0, r.stderr
    assert read_lines(replica_log_path(params.log_dir, "actor", 1))[0] == "cvd="


def test_task_script_picks_from_slurm_allocation(tmp_path):
    # Slurm gave this job GPUs 4-7 of the node: local task 1 with 2 GPUs gets 6,7
    params = task_params(tmp_path, gpu=2)
    r = run_task(params, procid=1, localid=1, CUDA_VISIBLE_DEVICES="4,5,6,7")
    assert r.returncode == 0, r.stderr
    assert read_lines(replica_log_path(params.log_dir, "actor", 1))[0] == "cvd=6,7"


def test_task_script_exit_code_and_setup_commands(tmp_path):
    params = task_params(tmp_path, gpu=0, additional_bash_cmds=["export FOO=from-setup"])
    r = run_task(params, procid=0, localid=0, EXIT_CODE="7")
    assert r.returncode == 7
    assert Path(exit_code_path(params.log_dir, "actor", 0)).read_text() == "7\n"
    lines = read_lines(replica_log_path(params.log_dir, "actor", 0))
    assert lines[-1] == "foo=from-setup"  # written before exit, nothing lost
    assert read_lines(role_log_path(params.log_dir, "actor"))[-1] == "[actor/0] foo=from-setup"


def test_task_script_replaces_a_stale_exit_file(tmp_path):
    params = task_params(tmp_path, gpu=0)
    stale = Path(exit_code_path(params.log_dir, "actor", 2))
    stale.parent.mkdir(parents=True)
    stale.write_text("99\n")
    r = run_task(params, procid=2, localid=0)
    assert r.returncode == 0, r.stderr
    assert stale.read_text() == "0\n"
    assert not Path(str(stale) + ".tmp").exists()


def test_task_script_missing_command_fails(tmp_path):
    spec = SchedulingSpec(cmd="/nonexistent/worker-binary")
    params = make_params(role="actor", spec=spec, log_dir=str(tmp_path / "logs"))
    r = run_task(params, procid=0, localid=0)
    assert r.returncode == 127
    assert "nonexistent" in Path(replica_log_path(params.log_dir, "actor", 0)).read_text()


def test_concurrent_tasks_append_whole_lines(tmp_path):
    """Many tasks writing at once: every line of the shared logs stays whole."""
    if BASH is None:
        pytest.skip("bash not available")
    n_lines, n_tasks = 300, 4
    cmd = (
        f"{sys.executable} -c 'import os\n"
        f'for i in range({n_lines}): print("line", i, "x" * (i % 97), flush=True)\''
    )
    params = make_params(
        role="gen", spec=SchedulingSpec(gpu=0, cmd=cmd), log_dir=str(tmp_path / "logs")
    )
    script = render_task_script(params)
    procs = [
        subprocess.Popen(
            [BASH, "-c", script],
            env={"PATH": os.environ["PATH"], "SLURM_PROCID": str(i), "SLURM_LOCALID": str(i)},
        )
        for i in range(n_tasks)
    ]
    assert [p.wait(timeout=60) for p in procs] == [0] * n_tasks
    pattern = re.compile(r"^\[gen/(\d)\] line (\d+) x*$")
    for path in (role_log_path(params.log_dir, "gen"), merged_log_path(params.log_dir)):
        lines = read_lines(path)
        assert len(lines) == n_lines * n_tasks
        seen: dict[str, list[int]] = {}
        for line in lines:
            m = pattern.match(line)
            assert m, f"torn or unprefixed line in {path}: {line!r}"
            seen.setdefault(m.group(1), []).append(int(m.group(2)))
        assert all(v == list(range(n_lines)) for v in seen.values())  # in order per task
        assert len(seen) == n_tasks
