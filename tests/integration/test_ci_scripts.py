"""The CI bootstrap (.ci/run -> scripts/test.sh, scripts/lint.sh) assumes no tool on PATH.

These run the real scripts with a PATH of shims: a broken ``ruff`` that must never be
used, and an ``apt-get`` that fails the way it does on a machine without network.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _shim(directory: Path, name: str, body: str) -> None:
    path = directory / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def _run(args: list[str], path_dirs: list[Path], **env: str) -> subprocess.CompletedProcess:
    full_env = {
        **os.environ,
        "PATH": os.pathsep.join([*map(str, path_dirs), "/usr/sbin", "/usr/bin", "/sbin", "/bin"]),
        "PYTHON": sys.executable,
        **env,
    }
    return subprocess.run(args, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=120)


def test_lint_uses_the_pinned_ruff_not_the_one_on_path(tmp_path):
    _shim(tmp_path, "ruff", 'echo "wrong ruff from PATH" >&2; exit 3')
    done = _run(["bash", "scripts/lint.sh"], [tmp_path])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "wrong ruff" not in done.stdout + done.stderr
    pinned = next(
        d
        for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
            "optional-dependencies"
        ]["dev"]
        if d.startswith("ruff")
    )
    assert re.fullmatch(r"ruff==[0-9.]+", pinned), f"ruff must be pinned exactly: {pinned}"
    assert f"ruff {pinned.split('==')[1]}" in done.stdout, done.stdout


def test_lint_without_ruff_installed_says_how_to_install(tmp_path):
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    done = _run(["bash", "scripts/lint.sh"], [tmp_path], PYTHON=str(bare / "bin" / "python"))
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert "ruff is not installed" in last and "scripts/test.sh --install-only" in last


def test_a_failed_install_step_stops_with_one_line_naming_it(tmp_path):
    _shim(tmp_path, "apt-get", 'echo "E: could not resolve deb.debian.org" >&2; exit 100')
    _shim(tmp_path, "pytest", "echo pytest-ran; exit 0")
    done = _run(["bash", "scripts/test.sh"], [tmp_path], CORRAL_APT_PACKAGES="slurm-wlm munge")
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("[test] FAILED step 'apt-get update' (exit 100)"), last
    assert "pip install" not in done.stdout, "later steps must not run after a failed one"
    assert "pytest-ran" not in done.stdout and "passed" not in done.stdout


def test_missing_apt_get_is_named_with_the_packages(tmp_path):
    tools = tmp_path / "tools"
    tools.mkdir()
    for name in ("dirname", "mktemp", "rm", "grep", "tail"):
        (tools / name).symlink_to(subprocess.check_output(["which", name], text=True).strip())
    env = {"PATH": str(tools)}  # coreutils only: no apt-get
    done = subprocess.run(
        ["/bin/bash", "scripts/test.sh", "--install-only"],
        cwd=ROOT,
        env={**os.environ, **env, "PYTHON": sys.executable, "CORRAL_APT_PACKAGES": "munge"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "apt-get not found" in done.stderr and "munge" in done.stderr


def test_ci_run_makes_a_fresh_venv_and_restricts_path():
    text = (ROOT / ".ci" / "run").read_text()
    order = [
        text.index(s) for s in ("-m venv --clear", "--install-only", "lint.sh", "--no-install")
    ]
    assert order == sorted(order), "CI must install, then lint, then test"
    path_line = next(line for line in text.splitlines() if line.startswith("export PATH="))
    assert "/usr/local" not in path_line and ".pyenv" not in path_line
