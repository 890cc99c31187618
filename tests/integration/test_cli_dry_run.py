"""`corral run --dry-run` as a command: it prints the request and writes nothing (the dry run's
logic in-process: tests/unit/test_dry_run.py)."""

from __future__ import annotations

import pytest

from tests.unit.test_dry_run import (
    EXPECTED,
    _cli,
)


@pytest.mark.parametrize("backend", ["local", "ray", "slurm"])
def test_cli_dry_run_prints_the_request_and_creates_no_fileroot(tmp_path, backend):
    fileroot = tmp_path / "root"
    rc, out, info = _cli(tmp_path, backend, str(fileroot))
    assert rc == 0
    for text in EXPECTED[backend]:
        assert text in out, (text, out)
    assert not fileroot.exists()  # no logs, secret or name-resolve directory
    assert info["ray"] is False  # no Ray import, let alone a runtime


@pytest.mark.parametrize("backend", ["local", "ray", "slurm"])
def test_cli_dry_run_writes_nothing_under_an_existing_fileroot(tmp_path, backend):
    fileroot = tmp_path / "root"
    fileroot.mkdir()
    _cli(tmp_path, backend, str(fileroot))
    assert list(fileroot.rglob("*")) == []
