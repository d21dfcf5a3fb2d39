"""Generate docs/api.md from the docstrings of the public modules.

    python docs/gen_api.py            # rewrites docs/api.md
    python docs/gen_api.py OUT.md     # writes elsewhere (the drift test uses this)

The reference is derived, never hand-edited: tests/test_notebooks.py regenerates it
and fails if docs/api.md differs, so a docstring change must come with a regeneration.
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from pathlib import Path
from typing import Any

# Modules documented, in reading order. Each lists the names in its ``__all__`` or,
# without one, the public classes and functions it defines itself.
MODULES = (
    "dp_textgrad",
    "dp_textgrad.front",
    "dp_textgrad.run_events",
    "dp_textgrad.dp_es.config",
    "dp_textgrad.dp_es.optimizer",
    "dp_textgrad.dp_es.plan",
    "dp_textgrad.dp_es.reports",
    "dp_textgrad.privacy.release",
    "dp_textgrad.privacy.accounting",
    "dp_textgrad.privacy.accounting.events",
    "dp_textgrad.privacy.data",
    "dp_textgrad.privacy.noise",
    "dp_textgrad.privacy.mechanisms",
    "dp_textgrad.privacy.voting",
    "dp_textgrad.dp_es.scorer",
    "dp_textgrad.dp_es.scoring_backends",
    "dp_textgrad.dp_es.selector",
    "dp_textgrad.dp_es.population",
    "dp_textgrad.dp_es.generation",
    "dp_textgrad.dp_es.mutation",
    "dp_textgrad.dp_es.labelling",
    "dp_textgrad.dp_es.labelling_phase",
    "dp_textgrad.dp_es.warmup",
    "dp_textgrad.workflow",
    "dp_textgrad.tasks.base",
    "dp_textgrad.tasks.synthetic",
    "dp_textgrad.tasks.loaders",
    "dp_textgrad.tasks.registry",
    "dp_textgrad.tasks.scored",
    "dp_textgrad.engines.base",
    "dp_textgrad.engines.llama_cpp",
    "dp_textgrad.engines.openai_engine",
    "dp_textgrad.federated",
    "dp_textgrad.audit",
    "dp_textgrad.integrations.guarantee",
    "dp_textgrad.integrations.dspy",
    "dp_textgrad.integrations.dspy.optimizer",
    "dp_textgrad.integrations.gepa",
)
# Packages whose names are re-exports: each name is listed with the module that defines it.
REEXPORTING = ("dp_textgrad", "dp_textgrad.audit", "dp_textgrad.dp_es.mutation", "dp_textgrad.integrations.dspy")

DEFAULT_OUTPUT = Path(__file__).resolve().parent / "api.md"

# Default values such as ``<object object at 0x7f...>`` change between processes.
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


class _Annotation:
    """Shows a string annotation (from ``from __future__ import annotations``) unquoted."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _unquoted(annotation: Any) -> Any:
    return _Annotation(annotation) if isinstance(annotation, str) else annotation


def _signature(obj: Any) -> str:
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return "(...)"
    signature = signature.replace(
        parameters=[p.replace(annotation=_unquoted(p.annotation)) for p in signature.parameters.values()],
        return_annotation=_unquoted(signature.return_annotation),
    )
    return _ADDRESS.sub("", str(signature))


def _doc(obj: Any) -> str:
    doc = inspect.getdoc(obj)
    return doc.strip() if doc else "*(no docstring)*"


def _public_names(module: Any) -> list[str]:
    if module.__name__ == "dp_textgrad":
        return [name for name in module.__all__ if not name.startswith("_")]
    names = getattr(module, "__all__", None)
    if names is not None:
        return list(names)
    return sorted(
        name for name, value in vars(module).items()
        if not name.startswith("_")
        and (inspect.isclass(value) or inspect.isfunction(value))
        and getattr(value, "__module__", None) == module.__name__
    )


def _class_members(cls: type) -> list[tuple[str, Any]]:
    """Public methods and properties defined by the class itself (not inherited)."""
    members = []
    for name, value in vars(cls).items():
        if name.startswith("_") and name != "__init__":
            continue
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        if inspect.isfunction(value) or isinstance(value, property):
            members.append((name, value))
    return members


def _render_class(name: str, cls: type, lines: list[str]) -> None:
    lines += [f"### class `{name}{_signature(cls)}`", "", _doc(cls), ""]
    for member_name, member in _class_members(cls):
        if member_name == "__init__":
            continue  # the class signature above already shows it
        if isinstance(member, property):
            lines.append(f"- property **`{member_name}`**")
            if member.__doc__:
                lines.append(f"  {inspect.cleandoc(member.__doc__).splitlines()[0]}")
        else:
            lines.append(f"- **`{member_name}{_signature(member)}`**")
            if member.__doc__:
                doc = inspect.cleandoc(member.__doc__)
                lines += ["", *[f"  {line}".rstrip() for line in doc.splitlines()], ""]
    lines.append("")


def render() -> str:
    lines = [
        "# API reference",
        "",
        "Generated from the docstrings by `python docs/gen_api.py`; do not edit by hand",
        "(`tests/test_notebooks.py` fails when this file and the code disagree).",
        "",
    ]
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        lines += [f"## `{module_name}`", "", _doc(module), ""]
        for name in _public_names(module):
            value = getattr(module, name)
            qualified = name
            if module_name in REEXPORTING:
                # Re-exported names: list where each is defined.
                home = getattr(value, "__module__", None)
                if home == module_name:  # defined there: its summary
                    lines.append(f"- `{name}{_signature(value)}`: {_doc(value).splitlines()[0]}")
                elif home is None:  # a constant: its value
                    lines.append(f"- `{name}` = `{_ADDRESS.sub('', repr(value))}`")
                else:
                    lines.append(f"- `{name}`: from `{home}`")
                continue
            if inspect.isclass(value):
                _render_class(qualified, value, lines)
            elif callable(value):
                lines += [f"### `{qualified}{_signature(value)}`", "", _doc(value), ""]
            else:
                lines += [f"### `{qualified}`", "", f"`{_ADDRESS.sub('', repr(value))}`", ""]
        if module_name in REEXPORTING:
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str]) -> int:
    output = Path(argv[1]) if len(argv) > 1 else DEFAULT_OUTPUT
    output.write_text(render(), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
