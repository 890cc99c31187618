"""``corral demo`` on each backend: it runs its steps, names the backend, stops every
worker and leaves nothing behind. (That the local demo learns: tests/integration/
test_examples.py; that the Ray demo prints no Ray log lines: tests/ray/test_quiet_demo.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_the_demo_runs_and_cleans_up(backend):
    trial = f"demo-{uuid.uuid4().hex[:8]}"
    fileroot = os.path.join(backend.fileroot, trial)
    proc = subprocess.run(
        [sys.executable, "-m", "corral.cli", "--fileroot", fileroot, "demo",
         "--scheduler", backend.name, "--steps", "5", "--no-torch", f"trial_name={trial}"],
        env={**os.environ, **backend.controller_env},
        cwd=ROOT, capture_output=True, text=True, timeout=280, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "step   5/5" in proc.stdout, proc.stdout[-3000:]
    assert f"backend                 {backend.name}" in proc.stdout
    assert "all workers stopped" in proc.stdout
    assert backend.leftovers("demo", trial) == []
