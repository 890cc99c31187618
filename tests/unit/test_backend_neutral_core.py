"""Backend knowledge stays in its backend's package: the core (src/corral outside
backends/) names no Slurm variable or command, and no core type carries a Slurm field."""

from __future__ import annotations

import re
from pathlib import Path

from corral.spec import Worker

SRC = Path(__file__).resolve().parents[2] / "src" / "corral"
#: a Slurm variable (SLURM_PROCID, SLURMD_NODENAME), or a Slurm command as a program name
SLURM_WORDS = re.compile(
    r"\bSLURMD?_[A-Z_]+\b|[\"'](?:squeue|sbatch|scancel|scontrol|sinfo|srun)[\"']"
)


def _core_files() -> list[Path]:
    return [p for p in SRC.rglob("*.py") if "backends" not in p.relative_to(SRC).parts]


def test_the_core_reads_no_slurm_variable_and_runs_no_slurm_command():
    found = [
        f"{p.relative_to(SRC)}:{n}: {line.strip()}"
        for p in _core_files()
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if SLURM_WORDS.search(line)
    ]
    assert found == [], "\n".join(found)


def test_the_core_worker_has_no_slurm_field():
    names = set(vars(Worker)) | set(Worker.__dataclass_fields__)
    assert not [n for n in names if "slurm" in n.lower()]
