"""Every valid bound of a run, and the smallest: the accountant set and its registry."""

from __future__ import annotations

import decimal
import math
from collections.abc import Mapping, Sequence
from typing import Any

from dp_accounting import dp_event as dpe

from dp_textgrad.privacy.accounting.accountants import (
    Accountant,
    PldAccountant,
    RdpAccountant,
)
from dp_textgrad.privacy.accounting.composition import (
    AdvancedCompositionAccountant,
    BasicCompositionAccountant,
)
from dp_textgrad.privacy.accounting.events import group_events, validate_events


def default_accountants() -> list[Accountant]:
    """RDP, PLD, DRV, KOV and basic composition (fresh instances)."""
    rdp, pld = RdpAccountant(), PldAccountant()
    return [
        rdp,
        pld,
        AdvancedCompositionAccountant("drv", pld=pld, rdp=rdp),
        AdvancedCompositionAccountant("kov", pld=pld, rdp=rdp),
        BasicCompositionAccountant(pld=pld, rdp=rdp),
    ]


def accountant_from_config(
    config: Mapping[str, Any],
    *,
    pld: PldAccountant | None = None,
    rdp: RdpAccountant | None = None,
) -> Accountant:
    """Rebuild an accountant from :meth:`Accountant.config` (pld/rdp: shared per-step helpers)."""
    options = dict(config)
    name = options.pop("name", None)
    if name == "rdp":
        return RdpAccountant(**options)
    if name == "pld":
        return PldAccountant(**options)
    if name in AdvancedCompositionAccountant.VARIANTS:
        return AdvancedCompositionAccountant(name, **options, pld=pld, rdp=rdp)
    if name == "basic":
        return BasicCompositionAccountant(**options, pld=pld, rdp=rdp)
    raise ValueError(f"accountant.name: unknown accountant {name!r}; use rdp, pld, drv, kov or basic")


def accountants_from_configs(configs: Sequence[Mapping[str, Any]]) -> list[Accountant]:
    """Rebuild a list, letting the composition baselines share the default-configured RDP/PLD."""
    built: list[Accountant | None] = [None] * len(configs)
    shared: dict[str, Any] = {}
    for i, config in enumerate(configs):
        if config.get("name") in ("rdp", "pld"):
            built[i] = accountant_from_config(config)
            if len(config) == 1:
                shared[config["name"]] = built[i]
    for i, config in enumerate(configs):
        if built[i] is None:
            built[i] = accountant_from_config(config, pld=shared.get("pld"), rdp=shared.get("rdp"))
    return [a for a in built if a is not None]


def all_bounds(accountants: Sequence[Accountant], events: Sequence[dpe.DpEvent], delta: float) -> dict[str, float]:
    """Every accountant's bound; inf for an accountant that cannot read some event."""
    groups = group_events(events)
    # hand every accountant the grouped form: each distinct part once, with its count
    compact = [atom if n == 1 else dpe.SelfComposedDpEvent(atom, n) for atom, n in groups]
    bounds: dict[str, float] = {}
    for accountant in accountants:
        if all(accountant.supports(atom) for atom, _ in groups):
            bounds[accountant.name] = float(accountant.epsilon(compact, delta))
        else:
            bounds[accountant.name] = math.inf
    return bounds


def format_epsilon(value: float, decimals: int = 4) -> str:
    """An epsilon bound as text with ``decimals`` fixed decimals, rounded UP (ceiling), never to nearest:
    a printed bound must not be below the proven one (3.412038 prints 3.4121, not 3.4120).

    The float's shortest decimal form (its ``repr``) is rounded, so 0.2 prints 0.2000; inf prints inf.
    """
    if isinstance(decimals, bool) or not isinstance(decimals, int) or decimals < 0:
        raise ValueError(f"decimals: must be an integer >= 0, got {decimals!r}")
    value = float(value) + 0.0  # -0.0 prints as 0
    if math.isnan(value) or math.isinf(value):
        return repr(value)
    # enough digits for any float (up to 1e308) at that many decimals: quantize is then exact
    context = decimal.Context(prec=decimals + 330, rounding=decimal.ROUND_CEILING)
    rounded = decimal.Decimal(repr(value)).quantize(decimal.Decimal(1).scaleb(-decimals), context=context)
    return f"{rounded:f}"


def smallest_bound(
    events: Sequence[dpe.DpEvent], delta: float, accountants: Sequence[Accountant] | None = None
) -> float:
    """The smallest valid epsilon among ``accountants`` (default: all five) at ``delta``."""
    accountants = default_accountants() if accountants is None else list(accountants)
    return min(all_bounds(accountants, validate_events(events), delta).values())
