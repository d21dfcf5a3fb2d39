"""L1 audit of the scorer as the library runs it: the real ``DPScorer`` at q < 1.

Unlike the other mechanism audits, nothing is simulated here: each run calls
``DPScorer.score`` (Gaussian scores) or ``DPScorer.select`` (Gumbel top-k) on a tiny
table task, so the real clipping, Poisson subsampling, charge and noise are what is
audited. The claim is read from what the runs actually charged (a recording ledger),
so a mechanism that skips its charge claims 0 and any positive lower bound flags it.

The canary scores 3C for candidate 0 (0 for the others); every background record
scores 0. Clipping to [0, C] bounds its effect; a scorer that forgot to clip would
shift candidate 0 by 3C. In the confusion audit the canary is also the one record the
candidate gets wrong (gold "yes", predicted "no"), so it adds 1 to one cell of the
released confusion matrix, which rides on the same subsample and charge as the score.
The failures audit runs a real ``GenerationTask`` (exact-match metric, its categorisation
and ``feedback_counts``) instead of the table: candidate 0 answers the canary right (score
C, category "correct") and every other output is wrong, so the canary adds C to the sum
and 1 to one cell of the released failure histogram, on the same subsample and charge.

The canary stands at each of ``positions`` places in turn (one group of runs per place,
Bonferroni over the groups): a subsample that is not
secret (drawn with a fixed seed) holds some places in every run, and there the
release is not amplified.
"""

from __future__ import annotations

import time
from typing import Any, Literal

import numpy as np

from dp_textgrad.audit.mechanism_audits.trials import MechanismAuditResult, RecordingLedger, Trials, claimed_epsilon
from dp_textgrad.audit.statistics.lower_bounds import EpsilonLowerBound, eps_lower_bound_from_scores
from dp_textgrad.privacy.data import PrivateDataset
from dp_textgrad.privacy.mechanisms import GaussianScoreMechanism, GumbelTopK, confusion_counts
from dp_textgrad.privacy.noise import NoiseSource

_CANARY_RAW = 3.0  # in units of C: above the clip bound on purpose


class _Record:
    def __init__(self, canary: bool) -> None:
        self.canary = canary


class _TableTask:
    """What ``DPScorer`` reads from a task: a private set, labels, a clip bound, outcomes, and
    the feedback counts (a confusion matrix, as ``ClassificationTask`` releases)."""

    labels = ["yes", "no"]

    def __init__(self, records: list[_Record], clip_bound: float) -> None:
        from dp_textgrad.tasks.base import FeedbackSpec

        self.private_train = PrivateDataset(records)
        self.clip_bound = clip_bound
        self.feedback = FeedbackSpec("confusion", tuple(self.labels))

    def feedback_counts(self, outcomes: Any) -> np.ndarray:
        return confusion_counts(outcomes.gold, outcomes.predicted, len(self.labels)).astype(float)

    def private_outcomes(self, engine: Any, prompt: str, batch: Any) -> Any:
        from dp_textgrad.tasks.base import RecordOutcomes

        favoured = prompt == "candidate 0"
        canary = np.array([r.unwrap().canary for r in batch], dtype=bool)
        raw = np.where(canary & favoured, _CANARY_RAW * self.clip_bound, 0.0)
        return RecordOutcomes(scores=raw, gold=np.zeros(len(raw), dtype=int), predicted=canary.astype(int))


class _CanaryEngine:
    """Generates for the failures audit: "yes" for the canary under candidate 0, else "no"."""

    def generate_after_prefix(self, prefix: str, suffixes: Any, **settings: Any) -> list[str]:
        favoured = prefix.startswith("candidate 0")
        return ["yes" if favoured and "canary" in suffix else "no" for suffix in suffixes]


def _generation_task(records: list[_Record], clip_bound: float) -> Any:
    """A real ``GenerationTask`` on the records (reference "yes"; exact match)."""
    from dp_textgrad.tasks.generation import GenerationExample, GenerationTask
    from dp_textgrad.tasks.metrics import metric_from_name

    examples = [GenerationExample("canary" if r.canary else "background", reference="yes") for r in records]
    return GenerationTask("audit", "", PrivateDataset(examples), [], metric_from_name("exact"), clip_bound=clip_bound)


class _Candidate:
    def __init__(self, index: int) -> None:
        self.id, self.text = f"c{index}", f"candidate {index}"


def audit_scorer(
    *,
    mechanism: Literal["gaussian", "confusion", "failures", "exponential"] = "gaussian",
    sampling_rate: float = 0.5,
    noise_multiplier: float = 2.0,
    feedback_noise_multiplier: float = 1.0,
    epsilon0: float = 2.0,
    candidates: int = 20,
    positions: int = 4,
    background: int = 3,
    clip_bound: float = 1.0,
    runs: int = 12000,
    delta: float = 1e-5,
    alpha: float = 0.05,
    seed: int = 0,
) -> MechanismAuditResult:
    """Audit the real ``DPScorer`` path on D vs D + canary (``runs`` per arm, split over the positions).

    Gaussian: the statistic is candidate 0's released noisy sum (one candidate). Confusion:
    the same sum plus candidate 0's noisy confusion matrix (``feedback_noise_multiplier``),
    combined as the likelihood-ratio statistic of the canary's shift (C on the sum, 1 on
    the cell yes -> no), each part divided by its released noise variance. Failures: the
    same with candidate 0's noisy failure histogram (the canary's unit in "correct"), through
    a real ``GenerationTask``. Exponential:
    whether candidate 0 was selected (Gumbel top-1 among ``candidates``); with many
    candidates "candidate 0" is rare without the canary, so the amplified pure-DP
    likelihood ratio 1 - q + q K P(selected | canary sampled) shows at moderate sample sizes.
    """
    from dp_textgrad.dp_es.scorer import DPScorer  # the real scorer, imported when audited

    trials = Trials.checked(runs, sampling_rate, 1.0, delta, alpha, False, seed)
    if mechanism not in ("gaussian", "confusion", "failures", "exponential"):
        raise ValueError(f"mechanism: use 'gaussian', 'confusion', 'failures' or 'exponential', got {mechanism!r}")
    if positions < 1 or positions > background + 1:
        raise ValueError(f"positions: must be in [1, background + 1 = {background + 1}], got {positions}")
    started = time.perf_counter()
    scores_only = mechanism != "exponential"
    k = 1 if scores_only else candidates
    pool = [_Candidate(i) for i in range(k)]
    per_group = max(1, trials.runs // positions)

    def arm(records: list[_Record], noise_seed: int, ledger: RecordingLedger, count: int) -> np.ndarray:
        # A table task in place of a ClassificationTask, and no engine: the table gives the outcomes.
        # The failures audit runs a real GenerationTask with an engine that answers by rule.
        generating = mechanism == "failures"
        table: Any = _generation_task(records, clip_bound) if generating else _TableTask(records, clip_bound)
        scorer = DPScorer(
            table,
            _CanaryEngine() if generating else None,  # type: ignore[arg-type]  # the table gives the outcomes
            ledger,
            sampling_rate=trials.sampling_rate,
            dataset_size=len(records),
            noise=NoiseSource(insecure_seed=noise_seed),
        )
        if mechanism == "gaussian":
            released = GaussianScoreMechanism(noise_multiplier, clip_bound, 1)
            return np.array([scorer.score(pool, released, "audit").noisy_sums[0] for _ in range(count)])
        if mechanism in ("confusion", "failures"):
            # the released cell the canary adds its unit to: yes -> no, or the category "correct"
            cell = (0, 1) if mechanism == "confusion" else (table.feedback.names.index("correct"),)
            with_matrix = GaussianScoreMechanism(noise_multiplier, clip_bound, 1, feedback_noise_multiplier)
            # the likelihood-ratio weights: each part's shift over its noise variance
            weights = (clip_bound / with_matrix.noise_std**2, 1.0 / with_matrix.confusion_noise_std(1) ** 2)
            out = []
            for _ in range(count):
                release = scorer.score(pool, with_matrix, "audit", feedback_candidates=[0])
                assert release.confusion is not None  # feedback_candidates asked for it
                out.append(weights[0] * release.noisy_sums[0] + weights[1] * release.confusion[0][cell])
            return np.array(out)
        selection = GumbelTopK(epsilon0, 1, clip_bound)
        return np.array([float(scorer.select(pool, selection, "audit")[0] == 0) for _ in range(count)])

    ledger = RecordingLedger()
    base = 10_000 * (seed + 1)
    nonmembers = arm([_Record(False) for _ in range(background)], base, RecordingLedger(), trials.runs)
    bounds: list[EpsilonLowerBound] = []
    for position in range(positions):
        records = [_Record(False) for _ in range(background)]
        records.insert(position, _Record(True))
        members = arm(records, base + 1 + position, ledger, per_group)
        if scores_only:
            bound = eps_lower_bound_from_scores(members, nonmembers, delta, alpha / positions, 0.5, seed=seed)
        else:
            bound = eps_lower_bound_from_scores(
                members, nonmembers, delta, alpha / positions, "bonferroni", thresholds=[0.5]
            )
        bounds.append(bound)
    # The claim is what each run charged; a run that charged nothing claims nothing.
    charged = ledger.events
    claim = claimed_epsilon(charged[0], delta) if len(charged) == per_group * positions else 0.0
    if any(repr(e) != repr(charged[0]) for e in charged):
        raise RuntimeError("audit_scorer: runs charged different events; the claim would not apply")
    best = max(bounds, key=lambda b: b.epsilon)
    return trials.result(
        f"scorer_{mechanism}",
        claim,
        best,
        None,
        started=started,
        parameters={
            "mechanism": mechanism,
            "noise_multiplier": float(noise_multiplier),
            "epsilon0": float(epsilon0),
            "feedback_noise_multiplier": float(feedback_noise_multiplier),
            "candidates": k,
            "positions": positions,
            "background": background,
            "clip_bound": float(clip_bound),
            "runs_per_position": per_group,
            "seed": seed,
            "eps_lb_by_position": [round(b.epsilon, 4) for b in bounds],
        },
        note="the real DPScorer (clipping, Poisson subsampling, charge, noise); claim from the charged events; "
        "canary at each position, Bonferroni over positions",
    )


__all__ = ["audit_scorer"]
