"""The benchmark table says how its baselines were made and marks a baseline that moved
more than 30 % from the previous run's (issue 29): the ratio alone would hide it."""

from __future__ import annotations

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "benchmarks"))

import report  # noqa: E402
from common import Row, python_provenance  # noqa: E402


def _row(key: str, baseline: float) -> Row:
    return Row(key=key, backend="local", label=key, unit="s", value=1.0, baseline=baseline)


def _doc() -> dict:
    machine = {
        "date": "d", "cpu_count": 2, "cpu_affinity": 2, "python": "3.11", "numpy": "x",
        "torch": None, "git_commit": "abc", "baseline_python": python_provenance(),
    }  # fmt: skip
    return {"machine": machine, "options": {"quick": True}}


def test_a_baseline_that_moved_more_than_30_percent_is_marked(tmp_path):
    before = [_row("a", 0.100), _row("b", 0.100), _row("c", 0.100)]
    (tmp_path / "latest.json").write_text(json.dumps({"rows": [r.to_json() for r in before]}))
    now = [_row("a", 0.125), _row("b", 0.140), _row("c", 0.060), _row("new", 1.0)]
    shared: dict = {}
    for row in now:  # rows of one benchmark may share their extra dict
        row.extra = shared
    report.write(str(tmp_path), _doc(), [r.finish() for r in now])
    lines = {
        line.split("`")[1]: line
        for line in (tmp_path / "latest.md").read_text().splitlines()
        if line.startswith("| ") and "`" in line
    }
    assert "moved" not in lines["a"]  # +25 %: within 30 %
    assert "**moved** +40%" in lines["b"]
    assert "**moved** -40%" in lines["c"]
    assert "moved" not in lines["new"]  # nothing to compare with
    saved = {r["key"]: r for r in json.loads((tmp_path / "latest.json").read_text())["rows"]}
    assert saved["b"]["extra"]["baseline_previous"] == 0.1


def test_the_table_says_how_the_baselines_were_made(tmp_path):
    report.write(str(tmp_path), _doc(), [_row("a", 0.1).finish()])
    text = (tmp_path / "latest.md").read_text()
    assert f"`{sys.executable}`" in text and "site-packages" in text and "venv" in text
    assert "corral bytecode" in text


def test_an_interrupted_run_keeps_its_rows_beside_the_last_full_record(tmp_path):
    report.write(str(tmp_path), _doc(), [_row("full", 0.1).finish()])
    doc = dict(_doc(), interrupted=True)
    report.write(str(tmp_path), doc, [_row("partial", 0.1).finish()], name="interrupted")
    partial = (tmp_path / "interrupted.md").read_text()
    assert "**interrupted**" in partial and "`partial`" in partial
    full = (tmp_path / "latest.md").read_text()
    assert "`full`" in full and "interrupted" not in full
