"""dp-textgrad: differentially private prompt optimization on TextGrad.

The front door::

    import dp_textgrad as dpt

    outcome = dpt.optimize(dpt.make_support_task(), dpt.LlamaCppEngine(), epsilon=4.0, generations=2)
    print(outcome.result.prompt, outcome.run_dir)

:func:`optimize` (and :func:`resume`) run DP-ES into a run directory as ``dp-textgrad
optimize`` does; :class:`DPEvolutionStrategy` is the TextGrad optimizer for a ``step()``
loop of your own, and :func:`textgrad` returns TextGrad imported without its side effects.

Attributes are loaded lazily (PEP 562) so that ``import dp_textgrad`` stays cheap; nothing
is written and no network is touched at import time.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    # the front door
    "optimize": "dp_textgrad.front",
    "resume": "dp_textgrad.front",
    "RunOutcome": "dp_textgrad.workflow",
    "Evaluation": "dp_textgrad.workflow",
    "GenerationReport": "dp_textgrad.dp_es.reports",
    "SearchResult": "dp_textgrad.dp_es.reports",
    "LifetimeOptions": "dp_textgrad.lifetime_link",
    # the TextGrad optimizer and its settings
    "DPEvolutionStrategy": "dp_textgrad.dp_es.optimizer",
    "EvolutionController": "dp_textgrad.dp_es.optimizer",
    "ConfigError": "dp_textgrad.dp_es.config",
    "DPESConfig": "dp_textgrad.dp_es.config",
    "LabellingConfig": "dp_textgrad.dp_es.config",
    # engines
    "LlamaCppEngine": "dp_textgrad.engines.llama_cpp",
    "OpenAIEngine": "dp_textgrad.engines.openai_engine",
    "ScriptedEngine": "dp_textgrad.engines.scripted",
    # tasks and private data
    "ClassificationTask": "dp_textgrad.tasks.base",
    "Example": "dp_textgrad.tasks.base",
    "Task": "dp_textgrad.tasks.base",
    "GenerationTask": "dp_textgrad.tasks.generation",
    "GenerationExample": "dp_textgrad.tasks.generation",
    "metric_from_name": "dp_textgrad.tasks.metrics",
    "make_support_task": "dp_textgrad.tasks.synthetic",
    "build_task_from_files": "dp_textgrad.tasks.loaders",
    "Private": "dp_textgrad.privacy.data",
    "PrivateDataset": "dp_textgrad.privacy.data",
    "PublicText": "dp_textgrad.privacy.data",
    "PrivateDataError": "dp_textgrad.privacy.data",
    # accounting
    "PrivacyLedger": "dp_textgrad.privacy.accounting.ledger",
    "BudgetExceeded": "dp_textgrad.privacy.accounting.ledger",
}

__all__ = sorted([*_EXPORTS, "__version__", "textgrad"])


def textgrad() -> ModuleType:
    """The ``textgrad`` module, imported without its side effects.

    textgrad 0.1.8 writes ``./logs/<timestamp>.jsonl`` at import time and logs every prompt
    into it (here prompts hold private records), and litellm, which it imports, fetches a
    model cost map from the network. This import writes nothing, stays offline and keeps
    textgrad's log records away from your handlers. Use it instead of ``import textgrad``
    (``tg = dp_textgrad.textgrad()``), before anything else imports textgrad.
    """
    from dp_textgrad._textgrad import import_textgrad

    return import_textgrad()


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dp_textgrad' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return list(__all__)
