"""``corral demo --scheduler ray`` prints the demo's lines only: none of Ray's own INFO
or WARNING lines (they show with ``--verbose``). A real Ray runtime, started by the demo
(``RAY_ADDRESS=local``: its own, whatever else runs on the machine)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RAY_LINE = re.compile(
    r"(\b(INFO|WARNING|WARN)\b\s+\S+\.py:\d+ --)|(^\[\d{4}-\d\d-\d\d [^\]]*\] \S+\.cc:\d+)",
    re.M,
)


def test_the_ray_demo_prints_no_ray_log_lines(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "corral.cli", "--fileroot", str(tmp_path), "demo",
         "--scheduler", "ray", "--steps", "2", "--no-torch"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
        env={**os.environ, "RAY_ADDRESS": "local"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "summary" in out.stdout and "all workers stopped" in out.stdout
    both = out.stdout + out.stderr
    assert not RAY_LINE.search(both), both
    assert out.stderr.strip() == "", out.stderr
