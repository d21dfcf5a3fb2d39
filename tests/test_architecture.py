"""The shape of the package: layers, no cycles, small modules, one place for each rule.

These read the source as text and import graphs; they fail when a change breaks a rule
of docs/architecture.md, naming the file and the rule.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.subprocess_driver import run_driver

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


def _imports(source: str, module: str, is_package: bool = False) -> set[str]:
    """dp_textgrad modules that module ``module`` (source text ``source``) imports anywhere: at the
    top, inside functions and classes, under ``try``/``if``, relative or absolute. Only imports
    under ``if TYPE_CHECKING:`` are left out (they never run)."""
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()

    class Reader(ast.NodeVisitor):
        def visit_If(self, node: ast.If) -> None:
            if "TYPE_CHECKING" in ast.unparse(node.test):
                for child in node.orelse:
                    self.visit(child)
            else:
                self.generic_visit(node)

        def visit_Import(self, node: ast.Import) -> None:
            found.update(a.name for a in node.names if a.name.split(".")[0] == "dp_textgrad")

        def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
            if node.level:  # relative: resolve against the importing module's package
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name.split(".")[0] == "dp_textgrad":
                found.add(name)
                found.update(f"{name}.{alias.name}" for alias in node.names)

    Reader().visit(ast.parse(source))
    return found


def _graph(sources: dict[str, str] | None = None) -> dict[str, set[str]]:
    """Module -> the dp_textgrad modules it imports; ``sources`` (name -> text) replaces the package."""
    if sources is None:
        sources = {name: path.read_text(encoding="utf-8") for name, path in _modules().items()}
    packages = {name.rpartition(".")[0] for name in sources}
    return {name: {m for m in _imports(text, name, name in packages) if m in sources and m != name}
            for name, text in sources.items()}


def test_no_module_is_over_the_size_limit() -> None:
    big = {name: n for name, path in _modules().items()
           if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert not big, f"modules over {MAX_MODULE_LINES} lines (split them along their concerns): {big}"


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (its modules in order, the first repeated at the end), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def test_import_graph_has_no_cycles() -> None:
    cycle = _find_cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


# Which layer may import which (lower layers never import higher ones).
LAYERS = [
    ("dp_textgrad.privacy", {"dp_textgrad.privacy"}),
    ("dp_textgrad.engines", {"dp_textgrad.engines", "dp_textgrad._textgrad"}),
    ("dp_textgrad.tasks", {"dp_textgrad.tasks", "dp_textgrad.privacy", "dp_textgrad.engines"}),
    ("dp_textgrad.dp_es", {"dp_textgrad.dp_es", "dp_textgrad.privacy", "dp_textgrad.engines", "dp_textgrad.tasks",
                           "dp_textgrad.runs", "dp_textgrad._textgrad", "dp_textgrad._io", "dp_textgrad"}),
]


def _upward_imports(graph: dict[str, set[str]], layer: str, allowed: set[str]) -> list[str]:
    bad = []
    for module, imports in sorted(graph.items()):
        if module == layer or module.startswith(layer + "."):
            for imported in sorted(imports):
                if not any(imported == a or imported.startswith(a + ".") for a in allowed if a != "dp_textgrad") \
                        and not ("dp_textgrad" in allowed and imported == "dp_textgrad"):
                    bad.append(f"{module} imports {imported}")
    return bad


@pytest.mark.parametrize("layer, allowed", LAYERS, ids=[name for name, _ in LAYERS])
def test_no_import_runs_up_the_layers(layer: str, allowed: set[str]) -> None:
    bad = _upward_imports(_graph(), layer, allowed)
    assert not bad, "imports that run up the layers:\n" + "\n".join(bad)


def _is_cli(module: str) -> bool:
    """The command line: dp_textgrad.cli, its cli_* command modules and audit's subcommand."""
    return module == "dp_textgrad.cli" or module.startswith("dp_textgrad.cli_") or module == "dp_textgrad.audit.cli"


def _library_imports_of_the_cli(graph: dict[str, set[str]]) -> list[str]:
    return [f"{module} imports {imported}" for module, imports in sorted(graph.items()) if not _is_cli(module)
            for imported in sorted(imports) if _is_cli(imported)]


def test_the_library_never_imports_the_cli() -> None:
    bad = _library_imports_of_the_cli(_graph())
    assert not bad, "library modules that import the CLI (the CLI sits on top of the library):\n" + "\n".join(bad)


# -- the rules see every import that runs, wherever it is written -------------------------------
PLANTED = {
    "dp_textgrad.privacy": "",
    "dp_textgrad.privacy.noise": "import math\n",
    "dp_textgrad.dp_es": "",
    "dp_textgrad.dp_es.scorer": "from dp_textgrad.privacy import noise\n",
    "dp_textgrad.cli": "from dp_textgrad.dp_es import scorer\n",
}


@pytest.mark.parametrize("planted", [
    "def sample():\n    from dp_textgrad.dp_es.scorer import DPScorer\n    return DPScorer\n",
    "class Source:\n    def draw(self):\n        import dp_textgrad.dp_es.scorer\n",
    "def sample():\n    try:\n        from dp_textgrad.dp_es import scorer\n    except ImportError:\n        pass\n",
    "def sample():\n    with open('x') as f:\n        from ..dp_es import scorer\n",
], ids=["function", "method", "try-in-function", "relative-in-with"])
def test_a_function_level_upward_import_is_caught(planted: str) -> None:
    graph = _graph({**PLANTED, "dp_textgrad.privacy.noise": planted})
    assert "dp_textgrad.privacy.noise imports dp_textgrad.dp_es.scorer" in _upward_imports(graph, *LAYERS[0])
    cycle = _find_cycle(graph)
    assert cycle is not None and "dp_textgrad.privacy.noise" in cycle and "dp_textgrad.dp_es.scorer" in cycle


def test_a_function_level_import_of_the_cli_is_caught() -> None:
    graph = _graph({**PLANTED, "dp_textgrad.dp_es.scorer": "def build():\n    from dp_textgrad import cli\n"})
    assert _library_imports_of_the_cli(graph) == ["dp_textgrad.dp_es.scorer imports dp_textgrad.cli"]


def test_imports_for_type_checking_only_are_left_out() -> None:
    planted = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from dp_textgrad.dp_es.scorer import DPScorer\n"
               "else:\n    from dp_textgrad.privacy import noise\n")
    graph = _graph({**PLANTED, "dp_textgrad.privacy.noise": planted})
    assert graph["dp_textgrad.privacy.noise"] == {"dp_textgrad.privacy"} and _find_cycle(graph) is None
    assert _upward_imports(graph, *LAYERS[0]) == []


def test_privacy_core_loads_no_llm_task_or_textgrad() -> None:
    imports = "import sys, pkgutil, importlib, dp_textgrad.privacy as p"
    code = ("for m in pkgutil.walk_packages(p.__path__, 'dp_textgrad.privacy.'): importlib.import_module(m.name)\n"
            "bad = [m for m in sys.modules if m.split('.')[0] in ('textgrad', 'litellm', 'llama_cpp', 'torch', "
            "'transformers', 'openai') or m.startswith(('dp_textgrad.engines', 'dp_textgrad.tasks', "
            "'dp_textgrad.dp_es'))]\n"
            "print(bad)\n")
    out = run_driver(imports, code).stdout.strip()
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
