"""The controller's open-file limit: raised toward the hard limit when a role needs it,
and a role that cannot fit under the hard limit is refused before anything starts with
an error naming `ulimit -n` (not a raw 'Too many open files' halfway through)."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import json, sys, psutil
    from corral import LocalScheduler, BaseExperimentConfig, Job, SchedulingSpec
    from corral.errors import ResourceLimitError
    root, replicas = sys.argv[1], int(sys.argv[2])
    cfg = BaseExperimentConfig(experiment_name="fds", trial_name="t")
    s = LocalScheduler(exp_config=cfg, fileroot=root, gpu_devices=[], progress=lambda t: None)
    out = {}
    try:
        out["ids"] = len(s.create_workers(
            Job(role="many", replicas=replicas, tasks=[SchedulingSpec(cpu=1)])))
    except ResourceLimitError as exc:
        out["error"] = str(exc)
        out["children"] = len(psutil.Process().children(recursive=True))
    import resource
    out["soft"] = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    s.close()
    print(json.dumps(out))
    """
)


def run_limited(tmp_path, soft: int, hard: int, replicas: int) -> dict:
    def limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    r = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path), str(replicas)],
        capture_output=True,
        text=True,
        timeout=240,
        preexec_fn=limit,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_role_beyond_the_hard_limit_is_refused_naming_ulimit(tmp_path):
    out = run_limited(tmp_path, 200, 200, 120)  # 2 descriptors per local worker
    assert "ids" not in out, out
    assert "ulimit -n" in out["error"] and "200" in out["error"], out["error"]
    assert out["children"] == 0  # refused before any worker started


def test_the_soft_limit_is_raised_toward_the_hard_one(tmp_path):
    out = run_limited(tmp_path, 100, 4096, 40)
    assert out.get("ids") == 40, out
    assert out["soft"] > 100
