"""dp-textgrad: differentially private prompt optimization on TextGrad.

``from dp_textgrad import DPEvolutionStrategy`` is the entry point. Attributes are
loaded lazily so that ``import dp_textgrad`` stays cheap; nothing is written and no
network is touched at import time.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "DPEvolutionStrategy": "dp_textgrad.dp_es.optimizer",
    "EvolutionController": "dp_textgrad.dp_es.optimizer",
    "RunResult": "dp_textgrad.dp_es.reports",
    "ConfigError": "dp_textgrad.dp_es.config",
    "DPESConfig": "dp_textgrad.dp_es.config",
    "PrivacyLedger": "dp_textgrad.privacy.accounting.ledger",
    "BudgetExceeded": "dp_textgrad.privacy.accounting.ledger",
    "Private": "dp_textgrad.privacy.data",
    "PrivateDataset": "dp_textgrad.privacy.data",
    "PublicText": "dp_textgrad.privacy.data",
    "PrivateDataError": "dp_textgrad.privacy.data",
    "ClassificationTask": "dp_textgrad.tasks.base",
    "Example": "dp_textgrad.tasks.base",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dp_textgrad' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
