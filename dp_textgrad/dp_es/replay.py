"""Interruptions that cost nothing where it can be proved: adopted charges, journaled releases.

A charge is kept in the ledger the moment it is made (charge before read), so a run
killed during a generation used to lose that generation's budget. Two records let the
resumed run take that charge over instead of paying again (``docs/privacy.md``,
"Interruptions"):

- the **journal**: as soon as a mechanism's output exists (noisy sums, noisy confusion
  matrices, selected indices) it is written atomically to ``operator/releases/<index>.json``
  BEFORE anything uses it. A charge that the interrupted attempt made and whose release
  is journaled is adopted and its release reused: post-processing, always sound.
- the **per-charge subsample seed**: each charge's Poisson subsample is drawn from a
  generator keyed by the run's secret (``operator/run_secret``, written before the first
  charge, never released) and the charge, so every attempt at a charge draws the same
  subsample. A charge made without a journaled release is adopted only when the scores
  on that subsample do not depend on how the earlier attempt ended (a backend that draws
  the subsample from the seed, an engine whose scores are deterministic); the noise is
  drawn afresh, after the point where the attempt stopped. Anything else is charged again.

The journal is operator-only: it holds DP outputs, but keyed to ledger entries, and it is
never read by a report.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dp_textgrad import _io, runs
from dp_textgrad.privacy.accounting.serialize import event_to_dict
from dp_textgrad.privacy.noise import NoiseSource, charge_generator


@dataclass
class Charge:
    """One charged mechanism as the scorer runs it: its ledger entry, and what an earlier
    attempt at it left (``journaled``: the parts of its release already written)."""

    index: int
    label: str
    adopted: bool
    journaled: dict[str, Any] = field(default_factory=dict)
    journal: ReplayJournal | None = None
    inputs: str = ""  # digest of the public inputs (candidate texts): a replay must see the same ones

    @property
    def key(self) -> str:
        return f"{self.index}:{self.label}"

    def sampling_rng(self, fallback: np.random.Generator) -> np.random.Generator:
        """This charge's subsample generator (the run's shared one without a journal)."""
        return fallback if self.journal is None else self.journal.subsample_generator(self.key)

    def noise(self, source: NoiseSource, part: str) -> NoiseSource:
        """The noise of one part of this charge's release (see :meth:`NoiseSource.for_charge`)."""
        return source if self.journal is None else source.for_charge(f"{self.key}/{part}")

    def record(self, **parts: Any) -> None:
        """Journal parts of the release (JSON values), before anything uses them."""
        self.journaled.update(parts)
        if self.journal is not None:
            self.journal.write(self)


class ReplayJournal:
    """The run's journal of releases and its subsample secret (one per run directory)."""

    def __init__(self, run_dir: runs.RunDir, noise: NoiseSource) -> None:
        self.run_dir = run_dir
        insecure = noise.replay_secret()
        if insecure is not None:
            # A test seed: the subsample is reproducible from it anyway (nothing to keep secret).
            self._secret, self.secret_predates_resume = insecure, True
        else:
            self._secret, self.secret_predates_resume = run_dir.read_or_create_secret()

    def subsample_generator(self, key: str) -> np.random.Generator:
        return charge_generator(self._secret, key)

    def path(self, index: int) -> Path:
        return self.run_dir.release(index)

    def read(self, index: int, label: str, inputs: str) -> dict[str, Any] | None:
        """The journaled parts of entry ``index``'s release ({} when none was written), or None when
        the attempt did not record the charge with these inputs (it is then charged again)."""
        path = self.path(index)
        if not path.is_file():
            return None
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None  # a torn file cannot exist (atomic writes); an unreadable one is not reused
        if data.get("label") != label or data.get("inputs") != inputs:
            return None
        return dict(data.get("parts") or {})

    def write(self, charge: Charge) -> None:
        runs.operator_dir(self.run_dir.path)
        _io.atomic_write_json(
            self.path(charge.index),
            {"index": charge.index, "label": charge.label, "inputs": charge.inputs, "parts": charge.journaled},
        )

    def charge(
        self, ledger: Any, event: Any, label: str, metadata: Mapping[str, Any], *, replayable: bool, inputs: str = ""
    ) -> Charge:
        """Adopt the interrupted attempt's entry for this charge when that is sound, else spend.

        Sound: the attempt recorded the charge with the same public ``inputs`` and either its
        release is journaled (reused as it is), or ``replayable`` (the subsample is redrawn from
        its seed and the scores do not depend on how the attempt ended) and the secret that
        seeded the attempt's subsample is the one this run holds. A new charge is recorded in
        the journal (no release yet) before it is spent.
        """
        entry = pending_entry(ledger, event, label, metadata)
        journaled = self.read(entry.index, label, inputs) if entry is not None else None
        if (
            entry is not None
            and journaled is not None
            and (journaled.get("complete") or (replayable and self.secret_predates_resume))
        ):
            ledger.adopt_next()
            return Charge(entry.index, label, True, journaled, self, inputs)
        # Recorded before the spend (at the index it will take), so that no kill falls between them.
        charge = Charge(len(ledger.entries), label, False, {}, self, inputs)
        self.write(charge)
        entry = ledger.spend(event, label, metadata=metadata)
        if entry.index != charge.index:  # pragma: no cover - the ledger appends at its end
            charge.index = entry.index
            self.write(charge)
        return charge


def pending_entry(ledger: Any, event: Any, label: str, metadata: Mapping[str, Any]) -> Any | None:
    """The interrupted attempt's next ledger entry when it is exactly the charge asked for now (same
    label, event and public metadata: candidates, rates, noise), else None: a changed setting or
    population is charged again."""
    pending = int(getattr(ledger, "pending_replays", 0))
    if not pending:
        return None
    entry = ledger.entries[len(ledger.entries) - pending]
    try:
        wanted = json.loads(json.dumps(dict(metadata), allow_nan=False))
    except (TypeError, ValueError):
        return None
    if entry.label != label or entry.event_dict != event_to_dict(event) or entry.metadata != wanted:
        return None
    return entry


__all__ = ["Charge", "ReplayJournal"]
