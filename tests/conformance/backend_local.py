from __future__ import annotations

import pytest

from corral.backends.local import LocalScheduler
from tests.conformance.harness import BackendUnderTest


@pytest.fixture(scope="session")
def local_backend(tmp_path_factory) -> BackendUnderTest:
    root = str(tmp_path_factory.mktemp("corral-local"))

    def make(cfg, **kwargs):
        kwargs.setdefault("gpu_devices", list(range(8)))
        kwargs.setdefault("startup_timeout", 60)
        return LocalScheduler(exp_config=cfg, fileroot=root, **kwargs)

    return BackendUnderTest(
        name="local",
        make=make,
        gpus_per_node=8,
        fileroot=root,
        lacks={
            "a queue": "a request beyond its free GPUs is refused at once (GPURequestError), "
            "it never waits for GPUs another trial holds",
            "preemption": "its workers run on the controller's own host: nothing takes them "
            "away to give them back later (requeue=True is for Slurm and Ray)",
        },
    )
