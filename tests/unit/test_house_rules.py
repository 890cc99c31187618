"""Two rules of the house, read from the source of src/corral (nothing is imported or run):

- no class has more than 4 bases (features are composed parts, not mixins);
- at most 5 reads of another object's private state across src/: ``x._name`` where ``x`` is
  not ``self``/``cls`` (an object's private names are its own business; a feature that needs
  one receives it explicitly).

Each checker is also run on small synthetic trees (tmp_path), so a tree that keeps the rule
passes and one that breaks it fails with a message naming the offenders.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"

MAX_BASES = 4
MAX_PRIVATE_READS = 5

# Private-looking names that are a documented public interface, so reading them is not
# reaching into another object's state. (module or object, name): why it does not count.
EXEMPT_MODULE_NAMES: dict[tuple[str, str], str] = {
    ("os", "_exit"): "documented in the os module: exit at once, without cleanup handlers "
    "(a forked child or a worker that must not run atexit hooks)",
    ("sys", "_getframe"): "documented in the sys module: the caller's frame",
    ("sys", "_current_frames"): "documented in the sys module: every thread's frame (stack dumps)",
}
EXEMPT_ATTRIBUTES: dict[str, str] = {
    # the documented namedtuple API: its methods start with "_" only to avoid field names
    "_replace": "namedtuple API (collections.namedtuple docs)",
    "_asdict": "namedtuple API (collections.namedtuple docs)",
    "_fields": "namedtuple API (collections.namedtuple docs)",
    "_make": "namedtuple API (collections.namedtuple docs)",
}


def _py_files(root: Path) -> list[Path]:
    return sorted(root.rglob("*.py"))


def _where(root: Path, path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(root)}:{node.lineno}"


def classes_with_too_many_bases(root: Path, limit: int = MAX_BASES) -> list[str]:
    """``file:line Class (n bases: A, B, ...)`` for every class over ``limit`` bases."""
    found = []
    for path in _py_files(root):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef) and len(node.bases) > limit:
                names = ", ".join(ast.unparse(b) for b in node.bases)
                found.append(
                    (
                        str(path),
                        node.lineno,
                        f"{_where(root, path, node)} {node.name} ({len(node.bases)} bases: {names})",
                    )
                )
    return [text for *_, text in sorted(found)]


def _is_own(value: ast.expr) -> bool:
    """``self``, ``cls``, ``super()`` or ``type(self)``: the object's own state."""
    if isinstance(value, ast.Name):
        return value.id in ("self", "cls")
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
        if value.func.id == "super":
            return True
        if value.func.id == "type" and len(value.args) == 1:
            return _is_own(value.args[0])
    return False


def _is_exempt(node: ast.Attribute) -> bool:
    if node.attr in EXEMPT_ATTRIBUTES:
        return True
    owner = node.value
    return isinstance(owner, ast.Name) and (owner.id, node.attr) in EXEMPT_MODULE_NAMES


def private_reads(root: Path) -> list[str]:
    """``file:line x._name`` for every use of a private name of something not self/cls."""
    found = []
    for path in _py_files(root):
        here = []
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Attribute):
                continue
            name = node.attr
            if not name.startswith("_") or (name.startswith("__") and name.endswith("__")):
                continue
            if _is_own(node.value) or _is_exempt(node):
                continue
            here.append(
                (node.lineno, node.col_offset, f"{_where(root, path, node)} {ast.unparse(node)}")
            )
        found += [text for *_, text in sorted(here)]
    return found


# ------------------------------------------------------------------ src/corral --
def test_no_class_has_more_than_4_bases():
    over = classes_with_too_many_bases(SRC)
    if over:
        pytest.fail(
            f"{len(over)} class(es) in src/ with more than {MAX_BASES} bases (compose parts that "
            "receive explicit state instead of mixing in):\n  " + "\n  ".join(over),
            pytrace=False,
        )


def test_at_most_5_reads_of_another_objects_private_state():
    reads = private_reads(SRC)
    if len(reads) > MAX_PRIVATE_READS:
        pytest.fail(
            f"{len(reads)} reads of another object's private state in src/ (at most "
            f"{MAX_PRIVATE_READS}; give the reader what it needs explicitly, or make the name "
            "public):\n  " + "\n  ".join(reads),
            pytrace=False,
        )


# ------------------------------------------------------- the checkers themselves --
def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_bases_checker_names_the_class_over_the_limit(tmp_path):
    root = _tree(
        tmp_path,
        {
            "pkg/ok.py": "class Four(A, B, C, D, metaclass=M):\n    pass\n",
            "pkg/mixed.py": "\n\nclass Five(A, B, C, D, E):\n    pass\n",
        },
    )
    assert classes_with_too_many_bases(root) == ["pkg/mixed.py:3 Five (5 bases: A, B, C, D, E)"]
    assert (
        classes_with_too_many_bases(_tree(tmp_path / "clean", {"a.py": "class A(B):\n  x=1\n"}))
        == []
    )


def test_private_read_checker_counts_other_objects_only(tmp_path):
    source = """
import os, sys

class Own:
    def method(self, other):
        self._mine = 1                  # own state
        cls_name = type(self)._TABLE    # own class
        super()._setup()                # own base
        os._exit(0)                     # documented stdlib name
        sys._getframe(1)
        point._replace(x=1)             # namedtuple API
        self.__class__                  # dunder
        return other._theirs            # COUNTS

    @classmethod
    def make(cls):
        return cls._registry            # own class

def feature(sched):
    with sched._lock:                   # COUNTS
        return self_like.runtime._finish  # COUNTS
"""
    reads = private_reads(_tree(tmp_path, {"m.py": source}))
    assert [r.split(" ", 1)[1] for r in reads] == [
        "other._theirs",
        "sched._lock",
        "self_like.runtime._finish",
    ]
    assert all(r.startswith("m.py:") for r in reads)


@pytest.mark.parametrize("count, ok", [(MAX_PRIVATE_READS, True), (MAX_PRIVATE_READS + 1, False)])
def test_the_private_read_limit_is_inclusive(tmp_path, count, ok):
    source = "".join(f"def f{i}(x):\n    return x._p{i}\n" for i in range(count))
    reads = private_reads(_tree(tmp_path, {"m.py": source}))
    assert (len(reads) <= MAX_PRIVATE_READS) is ok
