"""Privacy accounting: events as plain data, accountants that interpret them, the ledger.

- ``events.py``: our events (pure DP, Gumbel top-k) and the structure of event trees;
- ``dpa_extensions.py``: dp-accounting's RDP/PLD accountants extended to those events;
- ``accountants.py`` (RDP, PLD), ``composition.py`` (DRV, KOV, basic), ``bounds.py``
  (every valid bound, the smallest used);
- ``serialize.py``: events to and from JSON; ``ledger.py``: the run's ledger, its only
  writer; ``calibration.py``: noise from a budget.

Neighbouring relation: ``ADD_OR_REMOVE_ONE`` everywhere.
"""

from __future__ import annotations

from dp_textgrad.privacy.accounting.accountants import (
    DEFAULT_PLD_DISCRETIZATION,
    DEFAULT_RDP_ORDERS,
    Accountant,
    PldAccountant,
    RdpAccountant,
)
from dp_textgrad.privacy.accounting.bounds import (
    accountant_from_config,
    default_accountants,
    smallest_bound,
)
from dp_textgrad.privacy.accounting.calibration import (
    calibrate_noise_multiplier,
    calibrate_pure_epsilon,
)
from dp_textgrad.privacy.accounting.composition import (
    AdvancedCompositionAccountant,
    BasicCompositionAccountant,
    gaussian_analytic_epsilon,
)
from dp_textgrad.privacy.accounting.dpa_extensions import pure_dp_rdp
from dp_textgrad.privacy.accounting.events import (
    GumbelTopKDpEvent,
    PureDpEvent,
    UnsupportedEventError,
    amplify_pure_dp,
)
from dp_textgrad.privacy.accounting.ledger import (
    BudgetExceeded,
    LedgerEntry,
    PrivacyLedger,
)
from dp_textgrad.privacy.accounting.serialize import event_from_dict, event_to_dict

__all__ = [
    "Accountant",
    "AdvancedCompositionAccountant",
    "BasicCompositionAccountant",
    "BudgetExceeded",
    "DEFAULT_PLD_DISCRETIZATION",
    "DEFAULT_RDP_ORDERS",
    "GumbelTopKDpEvent",
    "LedgerEntry",
    "PldAccountant",
    "PrivacyLedger",
    "PureDpEvent",
    "RdpAccountant",
    "UnsupportedEventError",
    "accountant_from_config",
    "amplify_pure_dp",
    "calibrate_noise_multiplier",
    "calibrate_pure_epsilon",
    "default_accountants",
    "event_from_dict",
    "event_to_dict",
    "gaussian_analytic_epsilon",
    "pure_dp_rdp",
    "smallest_bound",
]
