"""The controller's shape (corral.controller): one owner for its state.

Read from the source, starting nothing: features receive ``ControllerParts`` and never
import ``Scheduler`` (TYPE_CHECKING included); nothing in the controller or its observers
reads another object's private attribute; the controller's modules import no circle
(TYPE_CHECKING imports count); ``Scheduler`` derives from nothing and each of its public
methods is a short hand-over to a feature.
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
CONTROLLER = SRC / "corral" / "controller"
OBSERVERS = [
    SRC / "corral" / "observe" / "snapshot.py",
    SRC / "corral" / "observe" / "publisher.py",
]
MAX_STATEMENTS = 3  # a hand-over: maybe a check, the call, its return


def _modules() -> dict[str, Path]:
    return {f"corral.controller.{p.stem}": p for p in CONTROLLER.glob("*.py")}


def _imported(tree: ast.AST) -> set[str]:
    """Every module an import names, TYPE_CHECKING blocks and function bodies included."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


def private_reads(path: Path) -> list[str]:
    """``x._name`` where ``x`` is not ``self`` or ``cls`` (dunders aside)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
        ):
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_feature_imports_the_scheduler():
    offenders = [
        name
        for name, path in _modules().items()
        if name != "corral.controller.scheduler"
        and "corral.controller.scheduler" in _imported(ast.parse(path.read_text()))
    ]
    assert offenders == [], f"features must receive ControllerParts, not Scheduler: {offenders}"


def test_the_controller_and_its_observers_read_no_private_state_of_other_objects():
    found = [r for path in [*_modules().values(), *OBSERVERS] for r in private_reads(path)]
    assert found == []


def test_no_import_circle_among_the_controller_modules_type_checking_included():
    modules = _modules()
    graph = {
        name: {m for m in _imported(ast.parse(path.read_text())) if m in modules and m != name}
        for name, path in modules.items()
    }
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        raise AssertionError(f"import circle: {exc.args[1]}") from None


def test_the_scheduler_is_a_table_of_contents():
    tree = ast.parse((CONTROLLER / "scheduler.py").read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Scheduler"]
    assert cls.bases == [], "Scheduler derives from nothing (no mixins)"
    long = []
    for node in cls.body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if node.name.startswith("_"):
            continue
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]  # the docstring
        if len(body) > MAX_STATEMENTS:
            long.append(f"{node.name}: {len(body)} statements")
    assert long == [], f"move the work into a feature of corral.controller: {long}"
