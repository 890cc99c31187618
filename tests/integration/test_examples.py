"""The specification's training-script example and the demo run on the local backend."""

from __future__ import annotations

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_spec_training_script_example_runs_on_local(tmp_path):
    out = subprocess.run(
        [sys.executable, "examples/training_script.py", f"cluster.fileroot={tmp_path}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "'completion': 'computing quantum Explain'" in out.stdout


def test_demo_runs_learns_and_cleans_up(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "corral.cli", "--fileroot", str(tmp_path), "demo", "--steps", "25"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "step  25/25" in text and "summary" in text and "all workers stopped" in text
    first = float(text.split("reward (first 3 steps)")[1].split()[0])
    last = float(text.split("reward (last 3 steps)")[1].split()[0])
    assert last > first, text
    logs = re.search(r"^\s+logs\s+(\S+)$", text, re.M).group(1)
    assert logs.startswith(str(tmp_path)) and os.path.exists(os.path.join(logs, "merged.log"))
    left = [
        os.path.join(d, f)
        for d, _, files in os.walk(os.path.join(tmp_path, "name_resolve"))
        for f in files
    ]
    assert left == []


def test_readme_python_example_runs(tmp_path):
    text = open(os.path.join(ROOT, "README.md")).read()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    code = code.replace(
        'trial_name="t1")', f'trial_name="t1")\ncfg.cluster.fileroot = {str(tmp_path)!r}'
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "'completion': 'world hello'" in out.stdout
