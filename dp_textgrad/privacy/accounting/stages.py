"""Completed stages of a ledger: pure-DP stages that later, adaptively planned charges add to.

A run whose dataset size is not declared releases a DP count of N first (stage 1) and
plans the search from it (stage 2). The search is chosen adaptively from a DP output, so
the ledger does not compose the two with PLD or RDP as one fixed sequence: it closes the
count's stage (:meth:`CompletedStages.complete_stage`) and reports every bound as the
completed stages' pure epsilon plus the current stage's own bound (basic composition, a
valid privacy filter: Rogers, Roth, Ullman and Vadhan 2016). See ``docs/privacy.md``,
"The dataset size".
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from dp_accounting import dp_event as dpe

from dp_textgrad.privacy.accounting.events import pure_epsilon_of


class CompletedStages:
    """Mixin of :class:`~dp_textgrad.privacy.accounting.ledger.PrivacyLedger` (its entries, persistence)."""

    _entries: list[Any]
    _completed_stages: list[dict[str, Any]]  # {"end": first entry after the stage, "epsilon": its epsilon}
    persist_path: str | None
    persist_to: Any
    if TYPE_CHECKING:

        @property
        def unsafe(self) -> bool: ...

    @property
    def completed_stage_epsilon(self) -> float:
        """Pure epsilon of the completed stages, added to every bound of the current stage."""
        return float(sum(stage["epsilon"] for stage in self._completed_stages))

    def _stage_events(self) -> list[dpe.DpEvent]:
        start = self._completed_stages[-1]["end"] if self._completed_stages else 0
        return [e.event for e in self._entries[start:]]

    def _with_completed(self, bounds: dict[str, float]) -> dict[str, float]:
        done = self.completed_stage_epsilon
        return {name: done + value for name, value in bounds.items()} if done else bounds

    def complete_stage(self) -> float:
        """Close the current stage: later charges compose with it by basic composition only.

        A later stage may be planned from this stage's outputs (the search's q from the DP
        count of N). Basic composition of an eps_1-DP stage and an adaptively chosen
        (eps_2, delta) stage is (eps_1 + eps_2, delta) (a valid privacy filter: Rogers, Roth,
        Ullman and Vadhan 2016), so every bound from now on is this stage's pure epsilon plus
        the later stage's own bound. The stage must be pure DP (its delta is 0); returns its epsilon.
        """
        events = self._stage_events()
        epsilon = pure_epsilon_of(dpe.ComposedDpEvent(events)) if events else 0.0
        if epsilon is None or not math.isfinite(epsilon):
            raise ValueError(
                "complete_stage: only a stage of pure-DP events (finite epsilon, delta 0) can be "
                "completed; its events are composed with the next stage otherwise"
            )
        self._completed_stages.append({"end": len(self._entries), "epsilon": float(epsilon)})
        if events:  # the stage's last entry states the totals after it: now the stage's pure epsilon
            last = self._entries[-1]
            totals = {name: self.completed_stage_epsilon for name in last.epsilons}
            self._entries[-1] = replace(
                last, epsilons=totals, epsilon=math.inf if self.unsafe else self.completed_stage_epsilon
            )
        self.persist_to(self.persist_path)  # the ledger's own writer (a no-op when it is in memory only)
        return float(epsilon)


__all__ = ["CompletedStages"]
