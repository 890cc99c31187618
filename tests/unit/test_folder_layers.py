"""The folders of the wire and the worker import in one direction, lowest first:

    errors, stop_deadline  <  auth, spec  <  rpc/  <  data/  <  worker/

A module may import its own layer or a lower one, never a higher one. Every import counts:
those under ``if TYPE_CHECKING`` and those inside functions too (a lazy import hides a loop
from Python, not from a reader). The source is read, nothing is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
LAYERS = {
    "corral.errors": 0,
    "corral.stop_deadline": 0,
    "corral.auth": 1,
    "corral.spec": 1,
    "corral.rpc": 2,
    "corral.data": 3,
    "corral.worker": 4,
}


def _name(path: Path, src: Path = SRC) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> int | None:
    for prefix, rank in LAYERS.items():
        if module == prefix or module.startswith(prefix + "."):
            return rank
    return None


def _imported(path: Path, here: str) -> set[str]:
    """Every corral module ``path`` names in an import, at any depth."""
    found = set()
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                root = package
                for _ in range(node.level - 1):
                    root = root.rpartition(".")[0]
                base = f"{root}.{base}" if base else root
            found.add(base)  # ``from corral.rpc import wire`` names corral.rpc.wire below
            found.update(f"{base}.{a.name}" for a in node.names if a.name[:1].islower())
    return {m for m in found if m.startswith("corral")}


def upward_imports(src: Path = SRC) -> list[str]:
    wrong = []
    for path in sorted((src / "corral").rglob("*.py")):
        here = _name(path, src)
        rank = _layer(here)
        if rank is None:
            continue
        for target in sorted(_imported(path, here)):
            other = _layer(target)
            if other is not None and other > rank:
                wrong.append(f"{here} (layer {rank}) imports {target} (layer {other})")
    return wrong


def test_the_layers_are_read() -> None:
    ranked = [p for p in (SRC / "corral").rglob("*.py") if _layer(_name(p)) is not None]
    assert len(ranked) > 30
    assert "corral.rpc.wire" in _imported(SRC / "corral/data/fetch.py", "corral.data.fetch")


def test_a_planted_upward_import_is_found(tmp_path: Path) -> None:
    (tmp_path / "corral" / "rpc").mkdir(parents=True)
    (tmp_path / "corral" / "rpc" / "wire.py").write_text(
        "if TYPE_CHECKING:\n    from corral.worker.runtime import WorkerRuntime\n"
    )
    assert upward_imports(tmp_path) == [
        "corral.rpc.wire (layer 2) imports corral.worker.runtime (layer 4)"
    ]


def test_folders_import_only_downwards() -> None:
    assert upward_imports() == []
