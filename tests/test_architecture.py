"""The shape of the package: layers, no cycles, private names kept private, one place for each rule.

These read the source as text and import graphs; they fail when a change breaks a rule
of docs/architecture.md, naming the file and the rule. Each rule has a planted violation
below that its checker must report, so a checker that went blind fails too.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.subprocess_driver import run_driver

PACKAGE = Path(__file__).resolve().parent.parent / "dp_textgrad"
ROOT = "dp_textgrad"  # the lazy front door (PEP 562): importing it runs nothing of the package

# Every top-level module and package of dp_textgrad, by layer. A module imports only modules of
# its own layer or of lower ones (a package's modules have the package's layer). Importing
# ``dp_textgrad`` itself is allowed everywhere: every import of a submodule runs it anyway, and it
# imports nothing eagerly (its exports load on first use).
LAYERS: dict[int, tuple[str, ...]] = {
    0: ("privacy",),  # the privacy core: barrier types, noise, mechanisms, accounting, the release table
    1: ("_io", "_textgrad"),  # atomic file writes; TextGrad imported without its side effects
    2: ("engines", "runs"),  # LLM engines; the run directory's layout and the state a checkpoint holds
    3: ("tasks",),  # tasks and their private data
    4: ("dp_es",),  # the algorithm
    5: ("distributed", "lifetime_link", "report", "run_events", "tracking"),  # around one search: Ray scoring,
    # a dataset's lifetime store, the report, the run's event stream and the trackers that observe it
    6: ("settings", "workflow"),  # one run: the sections that build its parts; the run from plan to run directory
    7: ("front", "federated", "audit", "integrations"),  # what is built on runs: the front door, federated runs,
    # audits, and the DSPy and GEPA integrations
    8: ("cli",),  # the command line, which no library module imports
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _sources() -> dict[str, str]:
    return {name: path.read_text(encoding="utf-8") for name, path in _modules().items()}


def _import_statements(source: str, module: str, is_package: bool = False, *, eager_only: bool = False,
                       type_checking: bool = False) -> Iterator[tuple[str, list[str]]]:
    """Each import of a dp_textgrad module in ``source`` (the text of module ``module``): the module
    it names, resolved (relative imports against the importing module's package), and the names a
    ``from`` import takes from it (empty for ``import x``). Imports are read everywhere: at the top,
    inside functions and classes, under ``try``/``if``. Those under ``if TYPE_CHECKING:`` never run
    and are left out unless ``type_checking``; ``eager_only`` keeps only the imports that run when
    the module is imported (none inside a function)."""
    package = module if is_package else module.rpartition(".")[0]
    found: list[tuple[str, list[str]]] = []

    class Reader(ast.NodeVisitor):
        def visit_If(self, node: ast.If) -> None:
            if "TYPE_CHECKING" in ast.unparse(node.test) and not type_checking:
                for child in node.orelse:
                    self.visit(child)
            else:
                self.generic_visit(node)

        def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
            if not eager_only:
                self.generic_visit(node)

        visit_AsyncFunctionDef = visit_FunctionDef

        def visit_Import(self, node: ast.Import) -> None:
            found.extend((a.name, []) for a in node.names if a.name.split(".")[0] == ROOT)

        def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
            if node.level:  # relative: resolve against the importing module's package
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name.split(".")[0] == ROOT:
                found.append((name, [alias.name for alias in node.names]))

    Reader().visit(ast.parse(source))
    yield from found


def _imports(source: str, module: str, is_package: bool = False, *, eager_only: bool = False) -> set[str]:
    """dp_textgrad modules that module ``module`` (source text ``source``) imports anywhere (see
    :func:`_import_statements`); ``from x import y`` counts as importing ``x`` and ``x.y``."""
    found: set[str] = set()
    for name, names in _import_statements(source, module, is_package, eager_only=eager_only):
        found.add(name)
        found.update(f"{name}.{alias}" for alias in names)
    return found


def _packages(sources: dict[str, str]) -> set[str]:
    return {name.rpartition(".")[0] for name in sources}


def _graph(sources: dict[str, str] | None = None) -> dict[str, set[str]]:
    """Module -> the dp_textgrad modules it imports; ``sources`` (name -> text) replaces the package."""
    if sources is None:
        sources = _sources()
    packages = _packages(sources)
    return {name: {m for m in _imports(text, name, name in packages) if m in sources and m != name}
            for name, text in sources.items()}


# -- (a) layers ---------------------------------------------------------------------------------
def _layer(module: str) -> int | None:
    """The layer of ``module``: that of its top-level module or package (None: not in the table)."""
    top = module.split(".")[1] if module.startswith(ROOT + ".") else None
    return next((layer for layer, entries in LAYERS.items() if top in entries), None)


def _modules_without_a_layer(graph: dict[str, set[str]]) -> list[str]:
    return [module for module in sorted(graph) if module != ROOT and _layer(module) is None]


def _upward_imports(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for module, imports in sorted(graph.items()):
        here = _layer(module)
        for imported in sorted(imports):
            there = _layer(imported)
            if here is not None and there is not None and there > here:
                bad.append(f"{module} (layer {here}) imports {imported} (layer {there})")
    return bad


def _eager_imports_of_the_front_door(sources: dict[str, str]) -> list[str]:
    """What ``dp_textgrad/__init__.py`` imports of the package when it is imported (it must be
    nothing: its exports load on first use, inside functions)."""
    if ROOT not in sources:
        return []
    return [f"{ROOT} imports {m} eagerly" for m in sorted(_imports(sources[ROOT], ROOT, True, eager_only=True))
            if m != ROOT and m in sources]


# -- (b) private names and private modules ------------------------------------------------------
def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _underscore_name_imports(sources: dict[str, str]) -> list[str]:
    """``from x import _name`` across modules, where ``_name`` is not a module of its own (a private
    module is the next rule's business). Imports for type checking count: they bind the name too."""
    packages = _packages(sources)
    bad = []
    for module, text in sorted(sources.items()):
        for name, names in _import_statements(text, module, module in packages, type_checking=True):
            bad.extend(f"{module} imports {name}.{alias}" for alias in names
                       if _is_private(alias) and f"{name}.{alias}" not in sources and name != module)
    return bad


def _private_home(module: str) -> str | None:
    """The package a private module belongs to (the one holding its first ``_`` part), or None."""
    parts = module.split(".")
    for i, part in enumerate(parts[1:], 1):
        if _is_private(part):
            return ".".join(parts[:i])
    return None


def _private_module_imports(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for module, imports in sorted(graph.items()):
        for imported in sorted(imports):
            home = _private_home(imported)
            if home is not None and module != home and not module.startswith(home + "."):
                bad.append(f"{module} imports {imported} (private to {home})")
    return bad


# -- (c) the command line sits on top and nothing imports it ------------------------------------
def _is_cli(module: str) -> bool:
    """The command line: the dp_textgrad.cli package and its modules."""
    return module == f"{ROOT}.cli" or module.startswith(f"{ROOT}.cli.")


def _library_imports_of_the_cli(graph: dict[str, set[str]]) -> list[str]:
    return [f"{module} imports {imported}" for module, imports in sorted(graph.items()) if not _is_cli(module)
            for imported in sorted(imports) if _is_cli(imported)]


# -- (d) no cycles ------------------------------------------------------------------------------
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


def _cycles(graph: dict[str, set[str]]) -> list[str]:
    cycle = _find_cycle(graph)
    return [] if cycle is None else [" -> ".join(cycle)]


RULES: dict[str, Callable[[dict[str, str], dict[str, set[str]]], list[str]]] = {
    "every module has a layer": lambda sources, graph: _modules_without_a_layer(graph),
    "imports run down the layers": lambda sources, graph: _upward_imports(graph),
    "the front door imports nothing eagerly": lambda sources, graph: _eager_imports_of_the_front_door(sources),
    "no underscore name crosses modules": lambda sources, graph: _underscore_name_imports(sources),
    "a private module stays in its package": lambda sources, graph: _private_module_imports(graph),
    "no library module imports the CLI": lambda sources, graph: _library_imports_of_the_cli(graph),
    "no import cycles": lambda sources, graph: _cycles(graph),
}


def _violations(sources: dict[str, str]) -> dict[str, list[str]]:
    """Every rule that ``sources`` breaks, with what breaks it."""
    graph = _graph(sources)
    return {rule: found for rule, check in RULES.items() if (found := check(sources, graph))}


# -- the rules on the package ------------------------------------------------------------------
@pytest.fixture(scope="module")
def package_sources() -> dict[str, str]:
    return _sources()


def test_every_module_has_a_layer(package_sources: dict[str, str]) -> None:
    missing = _modules_without_a_layer(_graph(package_sources))
    assert not missing, "give these a layer in LAYERS (tests/test_architecture.py):\n" + "\n".join(missing)


def test_the_layer_table_names_modules_that_exist(package_sources: dict[str, str]) -> None:
    stale = [entry for entries in LAYERS.values() for entry in entries if f"{ROOT}.{entry}" not in package_sources]
    assert not stale, f"LAYERS names modules that do not exist: {stale}"


def test_no_import_runs_up_the_layers(package_sources: dict[str, str]) -> None:
    bad = _upward_imports(_graph(package_sources))
    assert not bad, "imports that run up the layers (move the code, or the module to its layer):\n" + "\n".join(bad)


def test_the_front_door_imports_nothing_eagerly(package_sources: dict[str, str]) -> None:
    bad = _eager_imports_of_the_front_door(package_sources)
    assert not bad, "dp_textgrad/__init__.py loads its exports on first use (PEP 562):\n" + "\n".join(bad)


def test_no_module_imports_another_modules_underscore_names(package_sources: dict[str, str]) -> None:
    bad = _underscore_name_imports(package_sources)
    assert not bad, ("underscore names imported across modules (make the name public, or move it):\n"
                     + "\n".join(bad))


def test_private_modules_are_imported_only_inside_their_package(package_sources: dict[str, str]) -> None:
    bad = _private_module_imports(_graph(package_sources))
    assert not bad, "private modules imported from outside their package:\n" + "\n".join(bad)


def test_the_library_never_imports_the_cli(package_sources: dict[str, str]) -> None:
    bad = _library_imports_of_the_cli(_graph(package_sources))
    assert not bad, "library modules that import the CLI (the CLI sits on top of the library):\n" + "\n".join(bad)


def test_import_graph_has_no_cycles(package_sources: dict[str, str]) -> None:
    cycle = _find_cycle(_graph(package_sources))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


# -- each rule catches a planted violation, wherever the import is written ----------------------
# A small package that breaks no rule (its imports run down the layers, a private module and a
# private name stay at home, the CLI is imported by nothing); each test below breaks one rule.
PLANTED = {
    ROOT: '"""The front door."""\ndef textgrad():\n    from dp_textgrad._textgrad import import_textgrad\n',
    "dp_textgrad._textgrad": "def import_textgrad():\n    pass\n",
    "dp_textgrad.privacy": "",
    "dp_textgrad.privacy.noise": "import math\nfrom ._draws import draws\nfrom dp_textgrad.privacy import _draws\n",
    "dp_textgrad.privacy._draws": "def draws():\n    return _seed()\ndef _seed():\n    return 0\n",
    "dp_textgrad.dp_es": "",
    "dp_textgrad.dp_es.population": "class Member:\n    pass\nclass _Slot:\n    pass\n",
    "dp_textgrad.dp_es.scorer": "from dp_textgrad.privacy import noise\nfrom dp_textgrad import __version__\n",
    "dp_textgrad.dp_es.selector": "from . import scorer\nfrom .scorer import DPScorer as _Scorer\n",
    "dp_textgrad.audit": "",
    "dp_textgrad.audit.stats": "def build():\n    from dp_textgrad.dp_es.population import Member\n",
    "dp_textgrad.cli": "from dp_textgrad.dp_es import selector\nfrom dp_textgrad.audit import stats\n",
}


def _broken_rules(changes: dict[str, str]) -> dict[str, list[str]]:
    return _violations({**PLANTED, **changes})


def test_the_planted_package_breaks_no_rule() -> None:
    assert _violations(PLANTED) == {}


@pytest.mark.parametrize("planted", [
    "import dp_textgrad.dp_es.population\n",
    "def sample():\n    from dp_textgrad.dp_es.population import Member\n    return Member\n",
    "class Source:\n    def draw(self):\n        import dp_textgrad.dp_es.population\n",
    "def sample():\n    try:\n        from dp_textgrad.dp_es.population import Member\n    except ImportError:\n"
    "        pass\n",
    "def sample():\n    with open('x') as f:\n        from ..dp_es.population import Member\n",
    "async def sample():\n    if True:\n        from ..dp_es.population import Member\n",
], ids=["top", "function", "method", "try-in-function", "relative-in-with", "async"])
def test_an_upward_import_is_caught(planted: str) -> None:
    broken = _broken_rules({"dp_textgrad.privacy.noise": planted})
    assert broken == {"imports run down the layers": [
        "dp_textgrad.privacy.noise (layer 0) imports dp_textgrad.dp_es.population (layer 4)"]}


def test_an_upward_import_of_a_package_is_caught() -> None:
    broken = _broken_rules({"dp_textgrad.privacy": "def later():\n    from dp_textgrad import dp_es\n"})
    assert broken == {"imports run down the layers": [
        "dp_textgrad.privacy (layer 0) imports dp_textgrad.dp_es (layer 4)"]}


def test_a_module_without_a_layer_is_caught() -> None:
    broken = _broken_rules({"dp_textgrad.gadgets": "", "dp_textgrad.gadgets.widget": "import math\n"})
    assert broken == {"every module has a layer": ["dp_textgrad.gadgets", "dp_textgrad.gadgets.widget"]}


def test_a_module_has_the_layer_of_its_top_level_package() -> None:
    assert _layer("dp_textgrad.dp_es.mutation.operators") == _layer("dp_textgrad.dp_es") == 4
    assert _layer("dp_textgrad.privacy_extras") is None  # an entry names a module or package, not a prefix
    assert _layer(ROOT) is None  # the front door: see test_an_eager_import_in_the_front_door_is_caught


@pytest.mark.parametrize("planted", [
    "from dp_textgrad.dp_es import population\n",
    "import dp_textgrad.dp_es.population\n",
    "try:\n    from .dp_es import population\nexcept ImportError:\n    population = None\n",
    "class Front:\n    from dp_textgrad.dp_es.population import Member\n",
], ids=["from", "import", "relative-under-try", "class-body"])
def test_an_eager_import_in_the_front_door_is_caught(planted: str) -> None:
    broken = _broken_rules({ROOT: planted})
    assert list(broken) == ["the front door imports nothing eagerly"]
    found = broken["the front door imports nothing eagerly"]
    assert "dp_textgrad imports dp_textgrad.dp_es.population eagerly" in found


@pytest.mark.parametrize("planted, found", [
    ("from dp_textgrad.dp_es.population import _Slot\n", "dp_textgrad.dp_es.population._Slot"),
    ("from .population import Member, _Slot as Slot\n", "dp_textgrad.dp_es.population._Slot"),
    ("def f():\n    from ..privacy._draws import _seed\n", "dp_textgrad.privacy._draws._seed"),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from dp_textgrad.dp_es.population import _Slot\n",
     "dp_textgrad.dp_es.population._Slot"),
], ids=["absolute", "relative-aliased", "function", "type-checking"])
def test_an_underscore_name_import_is_caught(planted: str, found: str) -> None:
    module = "dp_textgrad.privacy.noise" if "_draws" in planted else "dp_textgrad.dp_es.scorer"
    broken = _broken_rules({module: planted})
    assert broken == {"no underscore name crosses modules": [f"{module} imports {found}"]}


@pytest.mark.parametrize("planted", [
    "from dp_textgrad.privacy import _draws\n",
    "def f():\n    from dp_textgrad.privacy._draws import draws\n",
    "import dp_textgrad.privacy._draws\n",
    "from ..privacy._draws import draws\n",
], ids=["from-package", "from-module-in-function", "import", "relative"])
def test_a_private_module_imported_from_outside_its_package_is_caught(planted: str) -> None:
    broken = _broken_rules({"dp_textgrad.dp_es.scorer": planted})
    assert broken == {"a private module stays in its package": [
        "dp_textgrad.dp_es.scorer imports dp_textgrad.privacy._draws (private to dp_textgrad.privacy)"]}


def test_a_private_module_of_the_root_is_everyones() -> None:
    assert _broken_rules({"dp_textgrad.dp_es.scorer": "from dp_textgrad._textgrad import import_textgrad\n"}) == {}


# The CLI is the top layer, so a library module that imports it breaks the layer rule as well; the
# CLI rule stays because it says why (and would still hold if the table gave the CLI a neighbour).
def test_a_function_level_import_of_the_cli_is_caught() -> None:
    broken = _broken_rules({"dp_textgrad.dp_es.population": "def build():\n    from dp_textgrad import cli\n"})
    assert broken["no library module imports the CLI"] == ["dp_textgrad.dp_es.population imports dp_textgrad.cli"]
    assert set(broken) == {"no library module imports the CLI", "imports run down the layers", "no import cycles"}


def test_an_import_of_a_cli_module_is_caught() -> None:
    cli = {"dp_textgrad.cli": "", "dp_textgrad.cli._console": "console = None\n",
           "dp_textgrad.cli.run": "from dp_textgrad.cli._console import console\nfrom dp_textgrad.audit import stats\n"}
    assert _broken_rules(cli) == {}
    library = "def main():\n    from dp_textgrad.cli._console import console\n"
    broken = _broken_rules({**cli, "dp_textgrad.audit": library})
    assert broken["no library module imports the CLI"] == ["dp_textgrad.audit imports dp_textgrad.cli._console"]
    assert set(broken) >= {"no library module imports the CLI", "imports run down the layers"}


def test_an_import_cycle_is_caught() -> None:
    broken = _broken_rules({"dp_textgrad.dp_es.scorer": "def later():\n    from . import selector\n"})
    assert list(broken) == ["no import cycles"]
    [cycle] = broken["no import cycles"]
    modules = cycle.split(" -> ")
    assert modules[0] == modules[-1] and set(modules) == {"dp_textgrad.dp_es.scorer", "dp_textgrad.dp_es.selector"}


def test_imports_for_type_checking_only_are_left_out_of_the_graph() -> None:
    planted = ("from typing import TYPE_CHECKING\n"
               "if TYPE_CHECKING:\n    from dp_textgrad.dp_es.scorer import DPScorer\nelse:\n    import math\n")
    graph = _graph({**PLANTED, "dp_textgrad.privacy.noise": planted})
    assert graph["dp_textgrad.privacy.noise"] == set()
    assert _broken_rules({"dp_textgrad.privacy.noise": planted}) == {}


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
    from dp_textgrad import runs

    # Every file name of a run directory and the runs root is a *_NAME constant of runs.py.
    names = [value for key, value in vars(runs).items() if key.endswith("_NAME") and isinstance(value, str)]
    assert {"checkpoint.json", "federation.json", "audit_seconds.json", "lifetime_budget.sqlite"} <= set(names)
    spelled = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name in ("runs.py", "release.py"):  # the layout, and the channel table that documents it
            continue
        text = path.read_text(encoding="utf-8")
        for name in names:
            if f'"{name}"' in text or f"'{name}'" in text:
                spelled.setdefault(name, []).append(str(path.relative_to(PACKAGE.parent)))
    assert not spelled, f"run-directory file names outside runs.py (use runs.RunDir): {spelled}"
