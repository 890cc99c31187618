"""Rules of the test suite itself, read from the test files (nothing is imported or run).

``sched`` is the conformance fixture of tests/conftest.py, parametrised over the backends
(local, ray, slurm). A module or conftest that defines its own ``sched`` silently shadows it
for every test below it, so a test that looks backend-parametrised runs on one backend only.
A test that needs one particular scheduler names its fixture for what it is (``local_sched``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
ROOT_CONFTEST = TESTS / "conftest.py"
SHARED_FIXTURE = "sched"


def _is_fixture(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return (isinstance(target, ast.Name) and target.id == "fixture") or (
        isinstance(target, ast.Attribute) and target.attr == "fixture"
    )


def _fixture_name(function: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    """The name pytest registers for ``function`` if it is a fixture (``name=`` wins)."""
    for decorator in function.decorator_list:
        if not _is_fixture(decorator):
            continue
        if isinstance(decorator, ast.Call):
            for keyword in decorator.keywords:
                if keyword.arg == "name" and isinstance(keyword.value, ast.Constant):
                    return keyword.value.value
        return function.name
    return None


def fixtures_named(root: Path, name: str, allowed: Path | None = None) -> list[str]:
    """``file:line`` of every fixture called ``name`` under ``root``, except in ``allowed``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if allowed is not None and path == allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if _fixture_name(node) == name:
                    found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_only_the_root_conftest_defines_sched():
    shadows = fixtures_named(TESTS, SHARED_FIXTURE, allowed=ROOT_CONFTEST)
    if shadows:
        pytest.fail(
            f"fixture {SHARED_FIXTURE!r} shadows the backend-parametrised one of "
            f"tests/conftest.py in: {', '.join(shadows)}. Name it for what it is (e.g. "
            "local_sched), or write the tests as conformance cases on the shared sched.",
            pytrace=False,
        )
    everywhere = fixtures_named(TESTS, SHARED_FIXTURE)
    assert [f for f in everywhere if f.startswith("conftest.py:")], (
        "the scan finds no sched fixture in tests/conftest.py: is the scan still right?"
    )


def test_the_scan_finds_every_way_to_name_a_fixture(tmp_path):
    (tmp_path / "conftest.py").write_text("import pytest\n@pytest.fixture\ndef sched(): ...\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "test_a.py").write_text(
        "import pytest\nfrom pytest import fixture\n\n"
        "@pytest.fixture(scope='module')\ndef sched(tmp_path): ...\n\n"
        "@fixture\nasync def sched(): ...\n\n"
        "@pytest.fixture(name='sched')\ndef local_one(): ...\n\n"
        "class TestX:\n    @pytest.fixture\n    def sched(self): ...\n\n"
        "@pytest.fixture\ndef local_sched(): ...\n\n"
        "def sched(): ...  # not a fixture\n"
    )
    found = fixtures_named(tmp_path, "sched", allowed=tmp_path / "conftest.py")
    assert found == ["sub/test_a.py:5", "sub/test_a.py:8", "sub/test_a.py:11", "sub/test_a.py:15"]
