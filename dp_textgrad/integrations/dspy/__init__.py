"""DSPy integration: compile a DSPy program with DP-ES and get an (epsilon, delta) guarantee.

::

    from dp_textgrad.integrations.dspy import DPES

    optimizer = DPES(metric, epsilon=4.0, public_trainset=public_examples)
    compiled = optimizer.compile(program, trainset=private_examples)
    compiled.dp_guarantee        # DPGuarantee: epsilon, delta, accountant, run_id, ...

Exports: :class:`DPES` (the optimizer), :class:`DPGuarantee` (what a compiled program carries
through ``save``/``load``), :class:`CompletionAdapter` (``dspy.Predict`` on a base completion
model), :class:`EngineLM` (a dp-textgrad engine as a ``dspy.LM``), :class:`DSPyLMEngine` (a DSPy
LM as a dp-textgrad engine) and :func:`program_as_task` (a program, metric and trainset as a
``ScoredTask``). Needs the ``dp-textgrad[dspy]`` extra; DSPy is imported on first use of an
export, not by importing this package.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dp_textgrad.integrations.dspy.adapter import CompletionAdapter
    from dp_textgrad.integrations.dspy.guarantee import DPGuarantee
    from dp_textgrad.integrations.dspy.lm import DSPyLMEngine, EngineLM
    from dp_textgrad.integrations.dspy.optimizer import AUTO_PRESETS, DPES
    from dp_textgrad.integrations.dspy.program_task import program_as_task

_EXPORTS = {
    "DPES": "optimizer",
    "AUTO_PRESETS": "optimizer",
    "DPGuarantee": "guarantee",
    "CompletionAdapter": "adapter",
    "EngineLM": "lm",
    "DSPyLMEngine": "lm",
    "program_as_task": "program_task",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


__all__ = ["AUTO_PRESETS", "DPES", "CompletionAdapter", "DPGuarantee", "DSPyLMEngine", "EngineLM", "program_as_task"]
