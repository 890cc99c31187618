"""examples/grpo_tiny on every backend: a few GRPO steps with real workers (tiny model).

The ``sched`` fixture (tests/conftest.py) gives a scheduler of each backend and, after
``close()``, asserts that the backend left nothing behind (processes, Ray actors and
placement groups, Slurm jobs, name-resolve entries)."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
import uuid

from examples.grpo_tiny.config import GRPOTinyConfig, check
from examples.grpo_tiny.job import GRPOJob
from examples.grpo_tiny.run import train
from tests.conformance.harness import pid_alive, sigint_not_ignored

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

STEPS = 3


def tiny_config() -> GRPOTinyConfig:
    cfg = GRPOTinyConfig()
    cfg.model.size = "tiny"
    cfg.task.prompts = 4
    cfg.task.group = 4
    cfg.train.steps = STEPS
    cfg.train.lr = 0.01  # large, so that every step visibly changes the weights
    return check(cfg)


def test_grpo_steps_train_and_sync_weights_to_every_rollout_worker(sched):
    job = GRPOJob(sched, tiny_config())
    job.start()
    assert len(job.ids["reward"]) == len(job.ids["rollout"]) == 2
    assert len(job.ids["trainer"]) == 2
    before = job.digests()
    lines: list[str] = []
    stats = train(job, STEPS, on_step=lines.append)
    after = job.digests()

    assert [s.step for s in stats] == list(range(1, STEPS + 1))
    assert len(lines) == STEPS and all("reward" in line and "sync" in line for line in lines)
    for s in stats:
        assert math.isfinite(s.loss), s
        assert 0.0 <= s.reward <= 1.0, s
        assert set(s.seconds) == {"generate", "reward", "train", "sync"}
        assert s.compute["generate"] > 0 and s.compute["train"] > 0, s
    # the trainers moved, together (DDP), away from the initial weights ...
    assert after["trainer"][0] != before["trainer"][0]
    assert after["trainer"][1] == after["trainer"][0]
    # ... and every rollout worker holds exactly the trainer's weights after the sync
    assert after["rollout"] == [after["trainer"][0]] * len(after["rollout"]), after


def test_ctrl_c_during_a_step_stops_every_worker(backend, tmp_path):
    """The example script, interrupted (SIGINT) once it has printed its second step."""
    trial = f"ctrlc{uuid.uuid4().hex[:6]}"
    exp = f"grpo-{backend.name}"
    proc = subprocess.Popen(
        [
            sys.executable,
            os.path.join(ROOT, "examples", "grpo_tiny", "run.py"),
            f"scheduler.type={backend.name}",
            f"cluster.fileroot={backend.fileroot}",
            f"experiment_name={exp}",
            f"trial_name={trial}",
            "model.size=tiny",
            "train.steps=500",
            f"output.png={tmp_path / 'curve.png'}",
        ],
        cwd=ROOT,  # as a user runs it (Ray's workers import the engines from the driver's cwd)
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **backend.controller_env},
        preexec_fn=sigint_not_ignored,
    )
    out, pids = [], []
    try:
        for line in proc.stdout:
            out.append(line)
            if "pids " in line:
                pids = [int(p.split("=")[1]) for p in line.split("pids ")[1].split()]
            if "step   2/500" in line:
                break
        assert len(pids) == 6 and all(pid_alive(p) for p in pids), "".join(out)
    finally:
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=120)
    text = "".join(out) + rest
    assert proc.returncode == 130, text
    assert "interrupted: stopping every worker" in text and "all workers stopped" in text
    assert not (tmp_path / "curve.png").exists()
    deadline = time.monotonic() + 10
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [p for p in pids if pid_alive(p)] == []
    assert backend.leftovers(exp, trial) == []
