"""The Renyi privacy filter that decides a dataset's lifetime cap (docs/privacy.md, "Lifetime budget").

Runs on a dataset are chosen after seeing earlier releases, so their composition is fully
adaptive: a cap on it is valid only as a privacy filter, a stopping rule fixed before the
first run. This one uses Renyi DP at a fixed set of orders with delta shared equally by
them (Feldman and Zrnic 2021 for one order; the several-order rule and its proof are in
the docs). The tightest accountants (PLD, ...) are for schedules fixed in advance.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from dp_accounting import dp_event as dpe

from dp_textgrad.privacy.accounting.accountants import RdpAccountant

# The Renyi orders of the lifetime filter, fixed for every store: the filter's guarantee
# needs its orders and their shares of delta chosen before any run. Each order gets
# delta/len, which costs log(len)/(alpha - 1) in epsilon (docs/privacy.md, "Lifetime budget").
FILTER_ORDERS: tuple[float, ...] = (
    1.5,
    2.0,
    2.5,
    3.0,
    4.0,
    5.0,
    6.0,
    8.0,
    10.0,
    12.0,
    16.0,
    20.0,
    24.0,
    32.0,
    40.0,
    48.0,
    63.0,
    128.0,
    256.0,
    512.0,
)


def filter_epsilon(events: Sequence[dpe.DpEvent], delta: float) -> float:
    """The Renyi filter bound of ``events`` at ``delta``: the epsilon a lifetime cap is checked against.

    min over the orders a in FILTER_ORDERS of
        R(a) + log((a - 1) / a) + (log(|FILTER_ORDERS| / delta) - log a) / (a - 1),
    R(a) the summed RDP of the events at order a: the conversion of Canonne, Kamath and
    Steinke (2020) with delta shared equally by the orders. A run of charges that keeps this
    within a cap fixed in advance is (cap, delta)-DP however the runs and their parameters
    were chosen (a filter; the proof is in docs/privacy.md). inf if RDP cannot read an event.
    """
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta: must be in (0, 1), got {delta!r}")
    if not events:
        return 0.0
    accountant = RdpAccountant(FILTER_ORDERS)
    if not all(accountant.supports(event) for event in events):
        return math.inf
    rdp = accountant.rdp_curve(list(events))
    orders = np.asarray(FILTER_ORDERS)
    bounds = (
        rdp + np.log((orders - 1.0) / orders) + (math.log(len(FILTER_ORDERS) / delta) - np.log(orders)) / (orders - 1.0)
    )
    return max(0.0, float(np.min(bounds)))


__all__ = ["FILTER_ORDERS", "filter_epsilon"]
