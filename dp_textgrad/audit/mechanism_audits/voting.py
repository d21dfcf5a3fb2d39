"""L1 audit of the teacher vote (GNMax and confident GNMax) as the library runs it.

Each run is one labelling phase of one public input through the real code: the keyed
partition (:func:`~dp_textgrad.privacy.voting.partition_teachers`), the charge, the teachers'
votes, the histogram and the noisy release (:func:`~dp_textgrad.privacy.voting.label_by_vote`).
The claim is read from what the runs charged (a recording ledger), so a release that skips its
charge claims 0. The teachers are stubs: each votes the label of the last record of its group
(None: it abstains), so a teacher's vote is a function of its group, as an LLM teacher's is.
The auditor knows the partition key, so it builds records that land on chosen teachers; a
correct partition is a function of each record alone, which the audit relies on and tests.

The canary (label 1) is appended at the end of D. Rows:

- ``gnmax``: two labels, label 0 leads label 1 by ``lead`` votes on D; the canary's teacher
  votes 0 on D and 1 on D + canary (one vote moves: the L2 sensitivity sqrt(2), the worst case).
  Statistic: label 1 released. The records are laid out so that a partition by position
  (contiguous chunks) would move many teachers' votes when the canary is appended.
- ``confident``: every teacher abstains on D (its records carry no label, and the canary's
  teacher has no records); on D + canary that teacher votes 1, so the max count moves 0 -> 1.
  Statistic: an answer released (the threshold step passed).
"""

from __future__ import annotations

import time
from typing import Any, Literal

import numpy as np

from dp_textgrad.audit.mechanism_audits.trials import MechanismAuditResult, RecordingLedger, Trials, claimed_epsilon
from dp_textgrad.audit.statistics.lower_bounds import eps_lower_bound_from_scores
from dp_textgrad.privacy import voting
from dp_textgrad.privacy.data import PrivateBatch, PrivateDataset
from dp_textgrad.privacy.noise import NoiseSource

AUDIT_KEY = b"dp-textgrad-audit-partition-key"


def _record(name: str, label: int | None) -> dict[str, Any]:
    return {"id": name, "label": label}


def _record_for(teacher: int, label: int | None, teachers: int, taken: set[str]) -> dict[str, Any]:
    """A fresh record that the keyed partition sends to ``teacher``."""
    for n in range(100 * teachers + 1000):
        name = f"r{n}"
        record = _record(name, label)
        if name not in taken and voting.teacher_of(record, AUDIT_KEY, teachers) == teacher:
            taken.add(name)
            return record
    raise RuntimeError("audit_voting: no record found for a teacher")  # pragma: no cover - 2^-100 odds


def _last_label_votes(group: PrivateBatch[dict[str, Any]]) -> list[voting.Vote]:
    """The stub teacher: the label of its group's last record (None: abstain), on the one input."""
    return [list(group)[-1].unwrap()["label"]]


def _gnmax_records(teachers: int, lead: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Background with ``lead`` more votes for label 0 than for 1 (the canary's teacher votes 0).

    Teacher t holds (a_t, b_t) in that order and votes label(b_t); the records are laid out
    a_0, b_0, a_1, b_1, ... with every a_t labelled 1. By position (contiguous chunks of two),
    appending one record moves each chunk by one: chunk t becomes (b_t, a_{t+1}) and votes 1.
    """
    canary = _record("canary", 1)
    target = voting.teacher_of(canary, AUDIT_KEY, teachers)
    zeros = (teachers + lead) // 2
    if (teachers + lead) % 2 or not 1 <= zeros <= teachers:
        raise ValueError(f"lead: teachers + lead must be even and lead in [2 - teachers, teachers], got {lead}")
    others = [t for t in range(teachers) if t != target]
    vote_zero = {target, *others[: zeros - 1]}
    taken: set[str] = {"canary"}
    records: list[dict[str, Any]] = []
    for t in range(teachers):
        records.append(_record_for(t, 1, teachers, taken))
        records.append(_record_for(t, 0 if t in vote_zero else 1, teachers, taken))
    return records, canary


def _confident_records(teachers: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One unlabelled record (its teacher abstains) for every teacher but the canary's, which has none."""
    canary = _record("canary", 1)
    target = voting.teacher_of(canary, AUDIT_KEY, teachers)
    taken: set[str] = {"canary"}
    return [_record_for(t, None, teachers, taken) for t in range(teachers) if t != target], canary


def audit_voting(
    *,
    mechanism: Literal["gnmax", "confident"] = "gnmax",
    teachers: int = 8,
    sigma: float = 2.0,
    lead: int = 4,
    threshold: float = 4.0,
    threshold_sigma: float = 1.5,
    runs: int = 20000,
    delta: float = 1e-5,
    alpha: float = 0.05,
    seed: int = 0,
) -> MechanismAuditResult:
    """Audit the real voting path on D vs D + canary (``runs`` labelling phases per arm).

    ``gnmax``: :class:`~dp_textgrad.privacy.voting.GNMax` (``sigma``) with ``lead`` as above.
    ``confident``: :class:`~dp_textgrad.privacy.voting.ConfidentGNMax` (``threshold``,
    ``threshold_sigma``, answer noise ``sigma``).
    """
    trials = Trials.checked(runs, 1.0, 1.0, delta, alpha, False, seed)
    if mechanism not in ("gnmax", "confident"):
        raise ValueError(f"mechanism: use 'gnmax' or 'confident', got {mechanism!r}")
    started = time.perf_counter()
    if mechanism == "gnmax":
        background, canary = _gnmax_records(teachers, lead)
        released: voting.VotingMechanism = voting.GNMax(sigma, 2)
    else:
        background, canary = _confident_records(teachers)
        released = voting.ConfidentGNMax(threshold, threshold_sigma, sigma, 2)

    def arm(records: list[dict[str, Any]], noise_seed: int, ledger: RecordingLedger) -> np.ndarray:
        partition = voting.partition_teachers(PrivateDataset(records), AUDIT_KEY, teachers)
        noise = NoiseSource(insecure_seed=noise_seed)
        out = np.empty(trials.runs)
        for run in range(trials.runs):
            label = voting.label_by_vote(ledger, released, partition, _last_label_votes, 1, noise, "audit")[0]
            out[run] = float(label is not None) if mechanism == "confident" else float(label == 1)
        return out

    base = 10_000 * (seed + 1)
    ledger = RecordingLedger()
    nonmembers = arm(background, base, RecordingLedger())
    members = arm([*background, canary], base + 1, ledger)
    bound = eps_lower_bound_from_scores(members, nonmembers, delta, alpha, "bonferroni", thresholds=[0.5])
    charged = ledger.events
    claim = claimed_epsilon(charged[0], delta) if len(charged) == trials.runs else 0.0
    if any(repr(e) != repr(charged[0]) for e in charged):
        raise RuntimeError("audit_voting: runs charged different events; the claim would not apply")
    return trials.result(
        f"voting_{mechanism}",
        claim,
        bound,
        None,
        started=started,
        parameters={
            "mechanism": mechanism,
            "teachers": teachers,
            "sigma": float(sigma),
            "lead": lead if mechanism == "gnmax" else None,
            "threshold": float(threshold) if mechanism == "confident" else None,
            "threshold_sigma": float(threshold_sigma) if mechanism == "confident" else None,
            "seed": seed,
        },
        note="the real partition, charge, histogram and release; stub teachers vote their last record's label; "
        "claim from the charged events; canary appended at the end",
    )


__all__ = ["AUDIT_KEY", "audit_voting"]
