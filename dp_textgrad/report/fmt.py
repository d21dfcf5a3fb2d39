"""Number formatting for reports: what a reader can quote, never a raw float repr."""

from __future__ import annotations

import math
from typing import Any

from dp_textgrad.privacy.accounting.bounds import format_epsilon


def _special(value: Any) -> str | None:
    """The text of a missing or infinite value, else None."""
    if value is None or math.isnan(float(value)):
        return "-"
    if math.isinf(float(value)):
        return "inf" if float(value) > 0 else "-inf"
    return None


def eps(value: Any, decimals: int = 4) -> str:
    """An epsilon bound, rounded UP at ``decimals`` decimals (a printed bound is never below the
    proven one); '-' for missing values, inf for an unbounded (non-private) run."""
    return _special(value) or format_epsilon(float(value), decimals)


def num(value: Any, digits: int = 3) -> str:
    """Fixed decimals (scores, accuracies); '-' for missing values."""
    return _special(value) or f"{float(value):.{digits}f}"


def sig(value: Any, digits: int = 3) -> str:
    """Significant digits (epsilons, noise multipliers, rates): 0.0667, 1.35, 4, 1e-05."""
    return _special(value) or f"{float(value):.{digits}g}"


def pct(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    return f"{float(value):.{digits}%}"


def interval(estimate: Any, low: Any, high: Any, digits: int = 3) -> str:
    """'0.512 [0.440, 0.583]'."""
    if estimate is None:
        return "-"
    return f"{num(estimate, digits)} [{num(low, digits)}, {num(high, digits)}]"


def stat_interval(value: dict[str, Any] | None) -> str:
    """An audit statistic stored as {'estimate', 'low', 'high'}."""
    if not value:
        return "-"
    return interval(value["estimate"], value["low"], value["high"])


def p_value(value: Any) -> str:
    """'p < 0.001' or 'p = 0.042'."""
    if value is None:
        return "p = -"
    value = float(value)
    return "p < 0.001" if value < 1e-3 else f"p = {value:.3f}" if value < 0.1 else f"p = {value:.2f}"


def signed(value: Any, digits: int = 3) -> str:
    return "-" if value is None else f"{float(value):+.{digits}f}"


# How reports and the console name a task's metric (``task.metric_name``); an unknown name
# (a ``python:MODULE:FUNCTION`` metric) is shown as it is.
METRIC_LABELS = {
    "accuracy": "accuracy",
    "exact": "exact match",
    "f1": "token F1",
    "numeric": "numeric answer accuracy",
    "rouge_l": "ROUGE-L F",
    "json_fields": "JSON field match",
    "regex": "regex match",
    "judge": "judge grade",
    "textgrad_loss": "TextGrad loss grade",
}
INTERVAL_LABELS = {"wilson": "Wilson", "bootstrap": "bootstrap"}


def metric_label(name: Any) -> str:
    """'token F1' for ``f1``, 'accuracy' for a classification task (or an old run that names none)."""
    key = str(name or "accuracy")
    return METRIC_LABELS.get(key, key)
