"""The subprocess-driver helper fails a test whenever the child did not run the path under test."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.subprocess_driver import IMPORTS_DONE, run_driver, run_script


def refused(match: str):
    return pytest.raises(pytest.fail.Exception, match=match)


def test_a_driver_that_cannot_import_fails_even_when_a_failure_was_expected() -> None:
    # The hollow privacy test's shape: the child dies on a moved module, the test expected exit 1.
    with refused("died before the end of its imports"):
        run_driver("import sys\nfrom tests.no_such_module import anything", "sys.exit(1)", expect_exit=1,
                   raises="RuntimeError")


def test_an_import_error_after_the_marker_fails() -> None:
    with refused("ModuleNotFoundError"):
        run_driver("import sys", "import tests.no_such_module", expect_exit=1, raises="ModuleNotFoundError")


def test_an_unexpected_exception_fails() -> None:
    with refused("raised ValueError, none was expected"):
        run_driver("import sys", "raise ValueError('boom')", expect_exit=1)
    with refused(r"did not end with RuntimeError \(it ended with KeyError\)"):
        run_driver("import sys", "raise KeyError('boom')", expect_exit=1, raises="RuntimeError")


def test_the_wrong_exit_code_fails() -> None:
    with refused("exited 3, expected 0"):
        run_driver("import sys", "sys.exit(3)")
    with refused("exited 0, expected 1"):
        run_driver("import sys", "print('fine')", expect_exit=1)


def test_a_driver_that_runs_its_path_passes_and_hides_the_marker(tmp_path) -> None:
    done = run_driver("import sys\nfrom tests.subprocess_driver import IMPORTS_DONE", "print(sys.argv[1])", "x",
                      cwd=tmp_path)
    assert done.returncode == 0 and done.stdout == "x\n" and IMPORTS_DONE not in done.stdout
    ended = run_driver("import sys", "raise RuntimeError('the expected end')", expect_exit=1, raises="RuntimeError")
    assert "the expected end" in ended.stderr
    chained = run_driver("import sys", "try:\n    raise KeyError('cause')\nexcept KeyError:\n    raise RuntimeError('end')",
                         expect_exit=1, raises="RuntimeError")
    assert "KeyError" in chained.stderr
    with refused(r"did not end with KeyError \(it ended with RuntimeError\)"):
        run_driver("import sys", "try:\n    raise KeyError('cause')\nexcept KeyError:\n    raise RuntimeError('end')",
                   expect_exit=1, raises="KeyError")


def test_a_script_is_run_without_the_repository_on_its_path(tmp_path) -> None:
    script = tmp_path / "uses_tests.py"
    script.write_text("import tests.helpers\n")
    with refused("ModuleNotFoundError"):
        run_script(script, cwd=tmp_path)
    (tmp_path / "fine.py").write_text("import sys\nprint(sys.argv[1:])\n")
    assert run_script(tmp_path / "fine.py", "a", cwd=tmp_path).stdout == "['a']\n"


# -- the conventions hold across the suite ------------------------------------------------------
TESTS = Path(__file__).resolve().parent
# Long-running servers, not drivers: servers.py waits until the server answers and fails with its log.
NOT_DRIVERS = {"subprocess_driver.py", "servers.py"}
SPAWNERS = {"run", "Popen", "call", "check_call", "check_output"}


def _python_children(tree: ast.AST) -> list[int]:
    """Lines that start ``sys.executable`` through the subprocess module directly."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in SPAWNERS \
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "subprocess" \
                and "sys.executable" in ast.unparse(node):
            lines.append(node.lineno)
    return lines


def _own_modules() -> set[str]:
    return {path.stem for path in TESTS.rglob("*.py")} | {path.name for path in TESTS.iterdir() if path.is_dir()}


def _bare_imports(tree: ast.AST, own: set[str]) -> list[int]:
    """Lines that import a module of tests/ by its bare name (``import helpers``) or edit sys.path."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] in own for a in node.names):
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] in own:
            lines.append(node.lineno)
        elif isinstance(node, ast.Call) and ast.unparse(node.func).startswith("sys.path."):
            lines.append(node.lineno)
    return lines


def test_every_python_child_runs_through_the_driver_helper() -> None:
    found = [f"{path.relative_to(TESTS)}:{line}" for path in sorted(TESTS.rglob("*.py")) if path.name not in NOT_DRIVERS
             for line in _python_children(ast.parse(path.read_text(encoding="utf-8")))]
    assert not found, ("run Python children with tests.subprocess_driver.run_driver/run_script, which fail when "
                       f"the child dies on an import: {found}")


def test_test_helpers_are_imported_from_the_tests_package() -> None:
    own = _own_modules() - {"tests"}
    found = [f"{path.relative_to(TESTS)}:{line}" for path in sorted(TESTS.rglob("*.py"))
             for line in _bare_imports(ast.parse(path.read_text(encoding="utf-8")), own)]
    assert not found, f"import test helpers as `from tests.helpers import ...`, without sys.path edits: {found}"


def test_the_guards_see_a_bare_driver_and_a_bare_import() -> None:
    planted = ast.parse("import subprocess, sys\nimport helpers\nfrom twin import run_twin\n"
                        "sys.path.insert(0, 'tests')\n"
                        "subprocess.run([sys.executable, '-c', 'import tests.gone'], capture_output=True)\n")
    assert _python_children(planted) == [5]
    assert _bare_imports(planted, {"helpers", "twin"}) == [2, 3, 4]
    assert _bare_imports(ast.parse("from tests.helpers import ZeroNoise\nfrom tests import twin\n"),
                         {"helpers", "twin"}) == []
