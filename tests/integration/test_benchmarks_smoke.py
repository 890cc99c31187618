"""The benchmark harness runs end to end in --quick mode and writes every expected row.

Only the shape of the results is checked: the figures depend on the machine and its load,
so no assertion here is about how fast anything is.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUN = os.path.join(REPO, "benchmarks", "run.py")

EXPECTED_KEYS = [
    "local.worker_start.n1",
    "local.worker_start.n8",
    "local.cold_start.n1",
    "local.cold_start.n8",
    "local.noop.p50",
    "local.noop.p99",
    "local.noop.p50.one_cpu",
    "local.fanout.rate",
    "local.payload.f32_1MiB",
    "local.payload.f32_1MiB.memcpy",
    "local.payload.f32_16MiB",
    "local.payload.f32_16MiB.memcpy",
    "local.payload.f32_128MiB",
    "local.payload.f32_128MiB.memcpy",
    "local.delete.n8",
    "local.delete.n8.left",
    "local.fork.n1",
]
TORCH_KEYS = [
    "local.payload.bf16_16MiB",
    "local.payload.bf16_16MiB.memcpy",
    "local.wire.bf16_16MiB",
]


def _has_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def _number(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _run_quick(backend: str, out) -> subprocess.CompletedProcess:
    """``run.py --quick`` of one backend. A run that hangs past 280 s (a hang guard, not a
    performance check) gets SIGTERM first, so that run.py stops what it started (worker
    processes, simulated hosts) before the test fails."""
    args = [sys.executable, RUN, "--quick", "--backends", backend, "--out", str(out)]
    proc = subprocess.Popen(
        args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        stdout, stderr = proc.communicate(timeout=280)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            stdout, stderr = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        raise AssertionError(f"run.py --backends {backend} hung:\n{stderr[-5000:]}") from None
    return subprocess.CompletedProcess(args, proc.returncode, stdout, stderr)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench-results")
    proc = _run_quick("local", out)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-5000:]}"
    return out, proc


def test_writes_json_with_every_row(quick_run):
    out, _ = quick_run
    doc = json.loads((out / "latest.json").read_text())
    for field in ("cpu_count", "python", "numpy", "torch", "date"):
        assert field in doc["machine"]
    assert doc["options"]["quick"] is True
    assert not doc["failed"]
    rows = {r["key"]: r for r in doc["rows"]}
    expected = EXPECTED_KEYS + (TORCH_KEYS if _has_torch() else [])
    missing = [k for k in expected if k not in rows]
    assert not missing, f"rows missing from latest.json: {missing}"
    for key in expected:
        row = rows[key]
        assert _number(row["value"]), (key, row["value"])
        assert _number(row["baseline"]), (key, row["baseline"])
        assert row["unit"] and row["baseline_label"], key
        if not key.endswith(".left"):
            assert _number(row["ratio"]), (key, row["ratio"])
        for target in row["targets"]:
            assert target["met"] in (True, False), (key, target)
    assert rows["local.delete.n8.left"]["samples"]["corral"], "no leftover checks recorded"
    assert rows["local.noop.p50"]["samples"]["corral"], "raw latencies are kept"


def test_bf16_moves_its_own_size(quick_run):
    assert _has_torch(), "torch is a test dependency (pip install -e .[torch])"
    out, _ = quick_run
    rows = {r["key"]: r for r in json.loads((out / "latest.json").read_text())["rows"]}
    wire = rows["local.wire.bf16_16MiB"]["extra"]
    assert wire["tensor_nbytes"] == 16 * 1024 * 1024
    assert wire["tensor_nbytes"] <= wire["frame_bytes"] < wire["tensor_nbytes"] + 4096
    assert rows["local.payload.bf16_16MiB"]["extra"]["verified_equal_and_bf16"] is True


def test_writes_markdown_table_with_every_row(quick_run):
    out, proc = quick_run
    text = (out / "latest.md").read_text()
    assert "| metric | corral | baseline | ratio | target | met? |" in text
    expected = EXPECTED_KEYS + (TORCH_KEYS if _has_torch() else [])
    table = [line for line in text.splitlines() if line.startswith("| ")]
    for key in expected:
        assert any(f"(`{key}`)" in line for line in table), f"no table row for {key}"
    assert "Peer figures" in text
    assert "| metric |" in proc.stdout  # the table is also printed


def test_leaves_no_fileroot_behind(quick_run):
    out, _ = quick_run
    doc = json.loads((out / "latest.json").read_text())
    assert not os.path.exists(doc["fileroot"])


def test_scale_rows_show_constant_threads_and_bounded_descriptors(tmp_path):
    """The scale benchmark (simulated workers, quick sizes) runs end to end; the controller's
    thread count is the same at both sizes and it holds at most 2 descriptors per worker."""
    proc = _run_quick("scale", tmp_path)
    assert proc.returncode == 0, f"stderr:\n{proc.stderr[-5000:]}"
    doc = json.loads((tmp_path / "latest.json").read_text())
    assert not doc["failed"], doc["failed"]
    rows = {r["key"]: r for r in doc["rows"]}
    for size in (128, 512):
        for what in ("register", "fanout", "delete", "fds_per_worker", "rss_per_worker"):
            assert _number(rows[f"scale.{what}.n{size}"]["value"]), f"scale.{what}.n{size}"
        assert rows[f"scale.fds_per_worker.n{size}"]["value"] <= 2.0, rows[
            f"scale.fds_per_worker.n{size}"
        ]
    threads = rows["scale.threads.n512"]
    # 4x the workers, the same threads (slack: a helper thread asyncio may start once)
    assert threads["value"] <= threads["baseline"] + 1, f"threads grew with workers: {threads}"
