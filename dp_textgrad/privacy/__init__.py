"""The privacy core: barrier types, noise, mechanisms, accounting and the release boundary.

It imports no LLM engine, no task and no textgrad: budgets and calibration need this
package alone. Names are loaded lazily, so ``import dp_textgrad.privacy`` is cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Private": "dp_textgrad.privacy.data",
    "PrivateBatch": "dp_textgrad.privacy.data",
    "PrivateDataset": "dp_textgrad.privacy.data",
    "PrivateDataError": "dp_textgrad.privacy.data",
    "PrivateScoringError": "dp_textgrad.privacy.data",
    "PublicText": "dp_textgrad.privacy.data",
    "NoiseSource": "dp_textgrad.privacy.noise",
    "PrivacyLedger": "dp_textgrad.privacy.accounting.ledger",
    "BudgetExceeded": "dp_textgrad.privacy.accounting.ledger",
    "default_accountants": "dp_textgrad.privacy.accounting.bounds",
    "smallest_bound": "dp_textgrad.privacy.accounting.bounds",
    "calibrate_noise_multiplier": "dp_textgrad.privacy.accounting.calibration",
    "calibrate_pure_epsilon": "dp_textgrad.privacy.accounting.calibration",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dp_textgrad.privacy' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
