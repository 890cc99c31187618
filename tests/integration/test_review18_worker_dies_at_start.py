"""review18: a worker that dies between its registration and the gathered /set_env +
/configure of its role's start (cold3: launch.finish_role, configure_all(along=))."""

from __future__ import annotations

import os
import signal
import time

import pytest

from corral import BaseExperimentConfig, Job, LocalScheduler
from corral.errors import WorkerConfigurationError


def test_a_worker_killed_before_its_rendezvous_fails_the_start_naming_it(tmp_path):
    cfg = BaseExperimentConfig(experiment_name="r18dies", trial_name="t")
    s = LocalScheduler(exp_config=cfg, fileroot=str(tmp_path), gpu_devices=[], startup_timeout=60)
    watch = s.parts.watch
    real = watch.await_registration

    def registered_then_killed(role, replicas, timeout):
        workers = real(role, replicas, timeout)
        os.kill(int(workers[0].pid), signal.SIGKILL)
        time.sleep(0.3)  # gone before the gathered /set_env and /configure go out
        return workers

    watch.await_registration = registered_then_killed
    try:
        started = time.monotonic()
        with pytest.raises(Exception) as info:
            s.create_workers(Job(role="w", replicas=2))
        took = time.monotonic() - started
        print(type(info.value).__name__, info.value, f"{took:.2f}s")
        assert not isinstance(info.value, WorkerConfigurationError), (
            "a dead worker reported as refusing its configuration"
        )
        assert "w/0" in str(info.value)
        assert took < 30
    finally:
        s.close()
