"""The module graph of src/corral: no import circle, and the layering rules of
docs/architecture.md (the worker never imports the backends or the controller).

Edges are read from the source (every ``import`` / ``from ... import`` of a corral
module, at any depth except under ``if TYPE_CHECKING``), so an import inside a function
counts too: a lazy import hides a circle from Python, not from a reader.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in (SRC / "corral").rglob("*.py")}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, here: str, is_package: bool, known: set[str]) -> set[str]:
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
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


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
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
    assert cycles(import_graph()) == []


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
