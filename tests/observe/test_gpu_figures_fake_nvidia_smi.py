"""GPU figures per worker, read with ``nvidia-smi``. There is no GPU here: a FAKE
``nvidia-smi`` (a shell script on PATH that prints what the real one prints for
``--query-gpu=index,utilization.gpu,memory.used --format=csv,noheader,nounits``) stands
for the physical GPUs; NVML is hidden so the ``nvidia-smi`` path is the one taken."""

from __future__ import annotations

import os
import sys

from corral.observe.resources import ResourceSampler

FAKE_NVIDIA_SMI = """#!/bin/sh
case "$*" in
  *--query-gpu=index,utilization.gpu,memory.used*) printf '0, 60, 1000\\n1, 40, 3000\\n2, 0, 0\\n' ;;
  *) exit 2 ;;
esac
"""


def test_gpu_use_per_worker_from_a_fake_nvidia_smi(tmp_path, monkeypatch):
    fake = tmp_path / "nvidia-smi"
    fake.write_text(FAKE_NVIDIA_SMI)
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setitem(sys.modules, "pynvml", None)
    rows = [
        {"id": "a/0", "backend": "slurm", "state": "running", "gpus": "0,1"},
        {"id": "a/1", "backend": "slurm", "state": "running", "gpus": "2"},
        {"id": "a/2", "backend": "slurm", "state": "running", "gpus": ""},
    ]
    ResourceSampler().sample(rows)
    assert rows[0]["gpu_util"] == 50.0 and rows[0]["gpu_mem_bytes"] == 4000 * 2**20
    assert rows[1]["gpu_util"] == 0.0 and rows[1]["gpu_mem_bytes"] == 0
    assert "gpu_util" not in rows[2]
