"""The module graph of src/corral: no import circle, and the layering rules of
docs/architecture.md (the worker never imports the backends or the controller).

Edges are read from the source (every ``import`` / ``from ... import`` of a corral
module, at any depth), so an import inside a function or under ``if TYPE_CHECKING``
counts too: a lazy or type-only import hides a circle from Python, not from a reader.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"


def _module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules(src: Path) -> dict[str, Path]:
    return {_module_name(p, src): p for p in (src / "corral").rglob("*.py")}


def _imports(tree: ast.AST, here: str, is_package: bool, known: set[str]) -> set[str]:
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = here if is_package else here.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}" if base else package
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in known:
                    found.add(sub)
                elif base in known:
                    found.add(base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    found.discard(here)
    return found


def import_graph(src: Path = SRC) -> dict[str, set[str]]:
    """Module -> the corral modules it imports, for the ``corral`` package under ``src``."""
    modules = _modules(src)
    known = set(modules)
    return {
        name: _imports(ast.parse(path.read_text()), name, path.name == "__init__.py", known)
        for name, path in modules.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def circle_path(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One walk around a circle of ``component``: ``[a, b, ..., a]``, each importing the next."""
    members = set(component)
    start = component[0]
    # breadth-first from start's imports back to start, inside the component
    previous: dict[str, str] = {}
    todo = [start]
    while todo:
        current = todo.pop(0)
        for nxt in sorted(graph.get(current, set()) & members):
            if nxt == start:
                path = [current]
                while path[-1] != start:
                    path.append(previous[path[-1]])
                return [start, *reversed(path[:-1]), start] if current != start else [start, start]
            if nxt not in previous:
                previous[nxt] = current
                todo.append(nxt)
    return component


def describe_circles(graph: dict[str, set[str]]) -> str:
    """The import circles, each as its modules and one walk around it."""
    lines = []
    for component in cycles(graph):
        lines.append(f"{len(component)} modules in a circle: {', '.join(component)}")
        lines.append("  e.g. " + " -> ".join(circle_path(graph, component)))
        for module in component:
            inside = sorted(graph.get(module, set()) & set(component))
            lines.append(f"  {module} imports {', '.join(inside)}")
    return "\n".join(lines)


def reaches(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_the_graph_is_read():
    graph = import_graph()
    assert (
        "corral.controller.scheduler" in graph
        and "corral.controller.settings" in graph["corral.controller.scheduler"]
    )
    assert "corral.config" in graph["corral.controller.settings"]
    assert "corral.worker.env" in graph["corral.worker.runtime"]


def test_cycle_finder_finds_a_planted_circle():
    graph = import_graph()
    graph["corral.config"] = graph["corral.config"] | {"corral.controller.scheduler"}
    assert any("corral.config" in c and "corral.controller.scheduler" in c for c in cycles(graph))


def test_no_import_circle():
    graph = import_graph()
    if cycles(graph):
        pytest.fail(
            "import circle(s) among src/corral modules (imports under TYPE_CHECKING and "
            "inside functions count):\n" + describe_circles(graph),
            pytrace=False,
        )


def _write_tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / "corral" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_a_type_checking_import_closes_a_circle(tmp_path):
    """Synthetic tree: b imports a only for type hints; that still is a circle."""
    src = _write_tree(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "from corral import b\n",
            "b.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from corral.a import Thing\n"
            ),
            "c.py": "def lazy():\n    from . import a\n",
        },
    )
    graph = import_graph(src)
    assert graph["corral.b"] == {"corral.a"} and graph["corral.c"] == {"corral.a"}
    assert cycles(graph) == [["corral.a", "corral.b"]]
    text = describe_circles(graph)
    assert "corral.a, corral.b" in text and "corral.a -> corral.b -> corral.a" in text


def test_a_tree_without_circles_passes(tmp_path):
    src = _write_tree(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "from corral import b\nfrom corral.pkg import c\n",
            "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from corral.pkg import c\n",
            "pkg/__init__.py": "",
            "pkg/c.py": "import os\n",
        },
    )
    graph = import_graph(src)
    assert graph["corral.a"] == {"corral.b", "corral.pkg.c"}
    assert cycles(graph) == [] and describe_circles(graph) == ""


def test_a_walk_goes_around_a_three_module_circle():
    graph = {"x": {"y"}, "y": {"z", "w"}, "z": {"x"}, "w": set()}
    assert cycles(graph) == [["x", "y", "z"]]
    assert circle_path(graph, ["x", "y", "z"]) == ["x", "y", "z", "x"]


def test_worker_never_reaches_backends_or_controller():
    graph = import_graph()
    forbidden = {m for m in graph if m.startswith("corral.backends.")} | {
        "corral.controller.scheduler",
        "corral.launcher",
        "corral.config",
    }
    for module in [m for m in graph if m.startswith("corral.worker")]:
        bad = reaches(graph, module) & forbidden
        assert not bad, f"{module} imports {sorted(bad)}; the worker must stay apart"


def test_procs_does_not_import_the_launcher():
    assert "corral.launcher" not in reaches(import_graph(), "corral.procs")


def test_backends_do_not_import_each_other():
    graph = import_graph()
    backends = ("corral.backends.local", "corral.backends.ray", "corral.backends.slurm")

    def backend_of(module: str) -> str | None:  # a backend's module, package or not
        return next(
            (b for b in backends if module == b or module.startswith((b + ".", b + "_"))), None
        )

    for name in [m for m in graph if backend_of(m)]:
        other = {d for d in graph[name] if backend_of(d) not in (None, backend_of(name))}
        assert not other, f"{name} imports {sorted(other)}"


def test_shared_core_does_not_import_a_backend():
    graph = import_graph()
    core = [
        m
        for m in graph
        if not m.startswith(("corral.backends.", "corral.demo", "corral.testing"))
        and m not in ("corral.cli",)
    ]
    # the backends' typed options are data the config reads (they import only errors)
    allowed = {"corral.backends.backend_options"}
    assert graph["corral.backends.backend_options"] <= {"corral.errors"}
    for module in core:
        bad = {d for d in graph[module] if d.startswith("corral.backends.")} - allowed
        assert not bad, f"{module} imports the backend module(s) {sorted(bad)}; use the registry"
