"""The shape of the package: layers, no cycles, small modules, one place for each rule.

These read the source as text and import graphs; they fail when a change breaks a rule
of docs/architecture.md, naming the file and the rule.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "dp_textgrad"
MAX_MODULE_LINES = 400


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _top_level_imports(path: Path) -> set[str]:
    """dp_textgrad modules imported when ``path`` is imported (not lazily, not for typing)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dp_textgrad"):
                found.add(node.module)
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.startswith("dp_textgrad"))
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body + node.orelse + [h for x in getattr(node, "handlers", []) for h in x.body])

    visit(tree.body)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: {m for m in _top_level_imports(path) if m in modules and m != name}
            for name, path in modules.items()}


def test_no_module_is_over_the_size_limit() -> None:
    big = {name: n for name, path in _modules().items()
           if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert not big, f"modules over {MAX_MODULE_LINES} lines (split them along their concerns): {big}"


def test_import_graph_has_no_cycles() -> None:
    graph = _graph()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt):] + [nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in graph:
        if node not in state:
            visit(node)


# Which layer may import which (lower layers never import higher ones).
LAYERS = [
    ("dp_textgrad.privacy", {"dp_textgrad.privacy"}),
    ("dp_textgrad.engines", {"dp_textgrad.engines", "dp_textgrad._textgrad"}),
    ("dp_textgrad.tasks", {"dp_textgrad.tasks", "dp_textgrad.privacy", "dp_textgrad.engines"}),
    ("dp_textgrad.dp_es", {"dp_textgrad.dp_es", "dp_textgrad.privacy", "dp_textgrad.engines", "dp_textgrad.tasks",
                           "dp_textgrad.runs", "dp_textgrad._textgrad", "dp_textgrad._io", "dp_textgrad"}),
]


@pytest.mark.parametrize("layer, allowed", LAYERS, ids=[name for name, _ in LAYERS])
def test_no_import_runs_up_the_layers(layer: str, allowed: set[str]) -> None:
    bad = []
    for module, imports in _graph().items():
        if module == layer or module.startswith(layer + "."):
            for imported in imports:
                if not any(imported == a or imported.startswith(a + ".") for a in allowed if a != "dp_textgrad") \
                        and not ("dp_textgrad" in allowed and imported == "dp_textgrad"):
                    bad.append(f"{module} imports {imported}")
    assert not bad, "imports that run up the layers:\n" + "\n".join(bad)


def test_privacy_core_loads_no_llm_task_or_textgrad() -> None:
    code = ("import sys, pkgutil, importlib, dp_textgrad.privacy as p\n"
            "for m in pkgutil.walk_packages(p.__path__, 'dp_textgrad.privacy.'): importlib.import_module(m.name)\n"
            "bad = [m for m in sys.modules if m.split('.')[0] in ('textgrad', 'litellm', 'llama_cpp', 'torch', "
            "'transformers', 'openai') or m.startswith(('dp_textgrad.engines', 'dp_textgrad.tasks', "
            "'dp_textgrad.dp_es'))]\n"
            "print(bad)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_selection_is_chosen_through_the_registry_only() -> None:
    pattern = re.compile(r"\bselection\s*(==|!=|\bin\b)")
    hits = [f"{path.relative_to(PACKAGE.parent)}:{i}" for path in PACKAGE.rglob("*.py")
            if path.name != "selector.py"
            for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)]
    assert not hits, f"branches on the selection outside dp_es/selector.py's registry: {hits}"


def test_the_ledger_file_has_one_writer() -> None:
    writers = [f"{path.relative_to(PACKAGE.parent)}:{i}" for path in PACKAGE.rglob("*.py")
               if path.name != "ledger.py"
               for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if ".to_jsonl(" in line]
    assert not writers, f"the ledger writes itself (persist_to); these write it too: {writers}"


def test_run_directory_file_names_are_spelled_once() -> None:
    names = ("checkpoint.json", "ledger.jsonl", "metrics.jsonl", "result.json", "config.json", "report.md",
             "released_prompt.txt", "audit.json", "cli_settings.json", "run_metadata.jsonl")
    spelled = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name in ("runs.py", "release.py"):  # the layout, and the channel table that documents it
            continue
        text = path.read_text(encoding="utf-8")
        for name in names:
            if f'"{name}"' in text:
                spelled.setdefault(name, []).append(str(path.relative_to(PACKAGE.parent)))
    assert not spelled, f"run-directory file names outside runs.py (use runs.RunDir): {spelled}"
