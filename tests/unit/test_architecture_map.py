"""docs/architecture.md's module tree names every module under src/corral, and only those."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "corral"
DOC = ROOT / "docs" / "architecture.md"


def modules_on_disk() -> set[str]:
    return {
        str(p.relative_to(SRC))
        for p in SRC.rglob("*.py")
        if "__pycache__" not in p.parts and p.name != "__init__.py"
    }


def modules_in_the_map(text: str) -> set[str]:
    """Paths from the fenced tree under "## The module tree": indentation gives folders."""
    block = text.split("## The module tree", 1)[1].split("```", 2)[1]
    found, folders = set(), []
    for line in block.splitlines():
        m = re.match(r"^(\s*)(\S+?)(/)? — ", line)
        if not m:
            continue
        depth = (len(m.group(1)) - 2) // 2  # the tree starts two spaces under "corral/"
        folders = folders[:depth]
        if m.group(3):
            folders.append(m.group(2))
        elif m.group(2).endswith(".py"):
            found.add("/".join([*folders, m.group(2)]))
    return found


def test_the_architecture_map_names_every_module_and_no_other():
    on_disk, mapped = modules_on_disk(), modules_in_the_map(DOC.read_text())
    assert not on_disk - mapped, f"add to docs/architecture.md's tree: {sorted(on_disk - mapped)}"
    assert not mapped - on_disk, f"gone, remove from the tree: {sorted(mapped - on_disk)}"


def test_the_map_reader_sees_nesting():
    text = (
        "## The module tree\n```\ncorral/\n  a.py — x\n  sub/ — y\n    b.py — z\n  c.py — w\n```\n"
    )
    assert modules_in_the_map(text) == {"a.py", "sub/b.py", "c.py"}
