"""DP scoring of candidate prompts on private records: the one place the algorithm reads them.

This module is the mechanism side (charge, noise, release); ``scoring_backends.py`` is only
where the clipped sums are computed. Per generation the :class:`DPScorer` charges the
ledger FIRST with the event of the mechanism it is about to run, then has its scoring
backend (:mod:`dp_textgrad.dp_es.scoring_backends`: this process, Ray workers or federated
silos) draw a Poisson subsample B (rate q, secret) and compute for each candidate k the
utility sum u_k = sum over B of clip(s_{i,k}, 0, C) (sensitivity C per candidate, see
:mod:`dp_textgrad.privacy.mechanisms`); the noise is added here.

- :meth:`DPScorer.score` runs a ``GaussianScoreMechanism``: all K noisy sums, plus the
  task's noisy feedback counts on the same subsample when the mechanism releases feedback
  (confusion matrices of a classification task, failure histograms of a generation task;
  one unit per record in each, so L2 sensitivity sqrt(m) for m of them).
- :meth:`DPScorer.select` runs a selection mechanism: indices only, on a fresh subsample.
- :meth:`DPScorer.score_exact`: NOT private, for the ``privacy='off'`` baseline only.

Estimates divide by the PUBLIC expected batch size q*N, never by the realised |B|
(which is private). A record that fails to score scores 0 (the backend's
:func:`~dp_textgrad.dp_es.scoring_backends.batch_totals`): failures are data, counted for the
operator and, with ``dp.max_error_share``, released as a noisy count charged with the scores.
Any other failure while records are read (a worker that dies) is rewritten into
:class:`PrivateScoringError`, which quotes nothing private.
"""

from __future__ import annotations

import copy
import hashlib
import json
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

import numpy as np

from dp_textgrad.dp_es.estimates import ReleasedScores
from dp_textgrad.dp_es.replay import Charge, ReplayJournal
from dp_textgrad.dp_es.scoring_backends import (
    LocalScoring,
    NoisingBackend,
    ScoringBackend,
    SeededScoringBackend,
    SubsampleTotals,
    adds_noise,
)
from dp_textgrad.privacy.data import PrivateScoringError
from dp_textgrad.privacy.mechanisms import (
    GaussianScoreMechanism,
    SelectionMechanism,
    selection_metadata,
)
from dp_textgrad.privacy.noise import NoiseSource
from dp_textgrad.privacy.validation import check_sampling_rate, positive_finite

if TYPE_CHECKING:
    from dp_textgrad.engines.base import Engine
    from dp_textgrad.tasks.base import Task


class CandidateLike(Protocol):
    """What the scorer reads from a candidate (``population.Candidate`` fits)."""

    id: str
    text: str


# Feedback candidates: indices fixed in advance, or chosen from the released scores.
FeedbackChoice = Sequence[int] | Callable[[ReleasedScores], Sequence[int]]


class LedgerLike(Protocol):
    def spend(self, event: Any, label: str, metadata: Mapping[str, Any] | None = None) -> Any: ...


def _check_candidates(candidates: Sequence[CandidateLike]) -> list[CandidateLike]:
    candidates = list(candidates)
    if not candidates:
        raise ValueError("candidates: give at least one candidate to score")
    for position, candidate in enumerate(candidates):
        if not hasattr(candidate, "id") or not isinstance(getattr(candidate, "text", None), str):
            raise TypeError(f"candidates[{position}]: needs an .id and a .text (str), like population.Candidate")
    ids = [c.id for c in candidates]
    if len(set(ids)) != len(ids):
        raise ValueError("candidates: candidate ids must be unique (deduplicate the population first)")
    return candidates


# -- the scorer -----------------------------------------------------------------------


class DPScorer:
    """Scores candidate prompts on the private set with DP; every read is charged first.

    ``dataset_size`` is the public N (declared public, or a DP count); estimates
    divide by q*N. ``sampling_rng`` draws the Poisson subsample; it must be secret for
    amplification by subsampling, so it defaults to the DP noise generator.
    """

    def __init__(
        self,
        task: Task,
        engine: Engine,
        ledger: LedgerLike,
        *,
        sampling_rate: float,
        dataset_size: float,
        noise: NoiseSource,
        sampling_rng: np.random.Generator | None = None,
        backend: ScoringBackend | None = None,
    ) -> None:
        if not callable(getattr(ledger, "spend", None)):
            raise TypeError("ledger: needs a spend(event, label, metadata=None) method (a PrivacyLedger)")
        if not isinstance(noise, NoiseSource):
            raise TypeError("noise: must be a NoiseSource (DP noise is never drawn from a seeded public generator)")
        if sampling_rng is None:
            sampling_rng = noise.sampling_generator
        if not isinstance(sampling_rng, np.random.Generator):
            raise TypeError("sampling_rng: must be a numpy Generator")
        self.task = task
        self.engine = engine
        self.ledger = ledger
        self.sampling_rate = check_sampling_rate(sampling_rate)
        self.dataset_size = positive_finite(dataset_size, "dataset_size")
        self.noise = noise
        self.sampling_rng = sampling_rng
        # Where the sums are computed (this process, or workers); it draws the subsample.
        self.backend = backend if backend is not None else LocalScoring(task, engine, sampling_rng, noise.secure)
        # The run directory's journal of releases (None: a run that cannot be resumed).
        self.journal: ReplayJournal | None = None
        # Where the count and first text of records that failed to score go (operator-only; None: dropped).
        self.operator_log: Callable[[str], object] | None = None

    def at_rate(self, sampling_rate: float) -> DPScorer:
        """This scorer (same task, engine, ledger, noise, backend and journal) drawing its
        subsamples at another public rate: the final estimate's (``dp.final_estimate``)."""
        view = copy.copy(self)
        view.sampling_rate = check_sampling_rate(sampling_rate)
        return view

    @property
    def clip_bound(self) -> float:
        return float(self.task.clip_bound)

    @property
    def expected_batch_size(self) -> float:
        """q*N: the public denominator of every estimate."""
        return self.sampling_rate * self.dataset_size

    # -- mechanisms (these read private data, after charging the mechanism's own event) ----
    def score(
        self,
        candidates: Sequence[CandidateLike],
        mechanism: GaussianScoreMechanism,
        label: str,
        feedback_candidates: FeedbackChoice = (),
    ) -> ReleasedScores:
        """Noisy utility sums of every candidate (+ noisy feedback counts of feedback candidates:
        confusion matrices, or a generation task's failure histograms; "confusion" below means either).

        ``mechanism`` is the object the plan holds for this generation: its event is
        charged, then it runs. Its confusion matrices (when it has a feedback noise
        multiplier) come from the same subsample and are part of that one event, so a
        mechanism that releases feedback needs feedback candidates (and one that does not
        must get none): what is charged is exactly what is released.

        ``feedback_candidates`` is a list of indices, or a function that picks them from
        the released scores (public: the matrices then describe candidates chosen by DP
        outputs, e.g. the top parent). The matrices are released after the scores, on
        the same subsample: an adaptive composition of two Gaussians given the
        subsample, which is one Gaussian with z_eff (Gaussian DP composes adaptively),
        sampled once: the event already charged.
        """
        candidates = _check_candidates(candidates)
        if not isinstance(mechanism, GaussianScoreMechanism):
            raise TypeError("mechanism: score() runs a GaussianScoreMechanism; use select() for selections")
        if mechanism.num_candidates != len(candidates):
            raise ValueError(
                f"mechanism.num_candidates: is {mechanism.num_candidates} but {len(candidates)} candidates were given"
            )
        if float(mechanism.clip_bound) != self.clip_bound:
            raise ValueError(
                f"mechanism.clip_bound: must be the task's clip_bound ({self.clip_bound}), got {mechanism.clip_bound}"
            )
        fixed = None if callable(feedback_candidates) else self._check_feedback(feedback_candidates, len(candidates))
        wants_feedback = callable(feedback_candidates) or bool(fixed)
        if mechanism.releases_feedback != wants_feedback:
            raise ValueError(
                "feedback_candidates: give them exactly when the mechanism releases confusion "
                "matrices (feedback_noise_multiplier set); the charge must match the release"
            )
        charge = self._charge(
            mechanism,
            label,
            candidates,
            {"feedback_candidates": 1 if callable(feedback_candidates) else len(fixed or [])},
        )
        # ---- private data is read only below this line, after the charge ----
        return self._run(
            candidates, label, mechanism, feedback_candidates if callable(feedback_candidates) else fixed, charge
        )

    def score_exact(
        self, candidates: Sequence[CandidateLike], feedback_candidates: FeedbackChoice = ()
    ) -> ReleasedScores:
        """NOT PRIVATE: exact scores (and confusion matrices) on a subsample, for baselines.

        Allowed only with a ledger already marked unsafe, so the run's record says it is
        not differentially private. Same subsample size and estimate as :meth:`score`,
        with zero noise.
        """
        if not getattr(self.ledger, "unsafe", False):
            raise PermissionError(
                "score_exact: reads private data without noise; the ledger must first be "
                "marked unsafe (use DPESConfig(privacy='off') for a non-private baseline)"
            )
        candidates = _check_candidates(candidates)
        fixed = None if callable(feedback_candidates) else self._check_feedback(feedback_candidates, len(candidates))
        return self._run(
            candidates,
            "exact scores (privacy off)",
            None,
            feedback_candidates if callable(feedback_candidates) else fixed,
        )

    def _run(
        self,
        candidates: list[CandidateLike],
        label: str,
        mechanism: GaussianScoreMechanism | None,
        feedback: Any,
        charge: Charge | None = None,
    ) -> ReleasedScores:
        """Subsample, release the sums, then (if asked) the confusion matrices on the same subsample.

        ``mechanism`` None: exact values (the non-private baseline). The per-record outcomes
        stay in this frame; a feedback chooser sees only released values. ``charge``: each
        part of the release is journaled before it is used, and a part an interrupted attempt
        journaled already is reused (see :mod:`dp_textgrad.dp_es.replay`).
        """
        held: dict[str, Any] = {}
        noise_std = mechanism.noise_std if mechanism is not None else 0.0
        # Silos that add the noise themselves (federated placements): take their released values.
        noised_at_source = mechanism is not None and adds_noise(self.backend)
        journaled = charge.journaled if charge is not None else {}
        rng = charge.sampling_rng(self.sampling_rng) if charge is not None else None

        def noise(part: str) -> NoiseSource:
            return charge.noise(self.noise, part) if charge is not None else self.noise

        def journal(**parts: Any) -> None:
            if charge is not None:
                charge.record(**parts)

        def read_scores() -> np.ndarray:
            if "sums" in journaled:  # released by the interrupted attempt: reuse (post-processing)
                held["noise_std"] = float(journaled["noise_std"])
                if journaled.get("errors") is not None:
                    held["errors"] = (float(journaled["errors"]), float(journaled["error_noise_std"]))
                return np.asarray(journaled["sums"], dtype=float)
            if noised_at_source:
                if mechanism is not None and mechanism.releases_errors:
                    raise ValueError(
                        "max_error_share: silos that add their own noise release no count of failed records; "
                        "remove dp.max_error_share"
                    )
                release = cast(NoisingBackend, self.backend).noised_sums(
                    [str(c.text) for c in candidates], self.sampling_rate, mechanism, bool(feedback)
                )
                if np.shape(release.values) != (len(candidates),):
                    raise RuntimeError("scoring backend: returned the wrong number of utility sums")
                held["noise_std"] = float(release.noise_std)
                values = np.asarray(release.values, dtype=float)
                journal(sums=values.tolist(), noise_std=held["noise_std"], complete=not feedback)
                return values
            totals = self._totals(candidates, with_confusion=bool(feedback), rng=rng)
            self._log_failures(label, totals)
            held["confusion"] = totals.confusion
            sums = totals.sums
            if mechanism is None:  # the non-private baseline: the exact count of failures too
                held["errors"] = (float(totals.errors), 0.0)
                return np.asarray(sums, dtype=float)
            values = np.asarray(mechanism.release(sums, noise("sums")), dtype=float)
            errors: dict[str, Any] = {}
            if mechanism.releases_errors:  # the same Gaussian event (effective_noise_multiplier)
                std = float(cast(float, mechanism.error_noise_multiplier))
                held["errors"] = (mechanism.release_errors(totals.errors, noise("errors")), std)
                errors = {"errors": held["errors"][0], "error_noise_std": std}
            journal(sums=values.tolist(), noise_std=float(noise_std), complete=not feedback, **errors)
            return values

        def read_confusion() -> np.ndarray:
            if "confusion" in journaled:  # released already: reuse; never a second release under one charge
                if journaled.get("feedback") != list(feedback):
                    raise RuntimeError("journal: the replayed feedback choice differs from the journaled one")
                held["confusion_std"] = float(journaled["confusion_std"])
                return np.asarray(journaled["confusion"], dtype=float)
            if noised_at_source:
                release = cast(NoisingBackend, self.backend).noised_confusion(list(feedback), mechanism)
                held["confusion_std"] = float(release.noise_std)
                values = np.asarray(release.values, dtype=float)
                journal(
                    confusion=values.tolist(),
                    confusion_std=held["confusion_std"],
                    feedback=list(feedback),
                    complete=True,
                )
                return values
            if "confusion" not in held:  # the sums were journaled: the same subsample again, from its seed
                held["confusion"] = self._totals(candidates, with_confusion=True, rng=rng).confusion
            counts = np.asarray(held["confusion"])[feedback]
            if mechanism is None:
                return counts
            values = np.asarray(mechanism.release_confusion(counts, noise("confusion")), dtype=float)
            journal(
                confusion=values.tolist(),
                confusion_std=float(mechanism.confusion_noise_std(len(feedback))),
                feedback=list(feedback),
                complete=True,
            )
            return values

        try:
            sums = self._read_private(label, read_scores)
            noise_std = held.get("noise_std", noise_std)
            errors = held.get("errors")
            released = self._released(candidates, sums, noise_std, [], None, None, errors)
            if callable(feedback):  # a function of the released scores only
                feedback = self._check_feedback(feedback(released), len(candidates))
                if not feedback:
                    raise ValueError(
                        "feedback_candidates: the chooser picked no candidate, but the matrices "
                        "were charged; return at least one index"
                    )
            if not feedback:
                return released
            confusion = self._read_private(label, read_confusion)
            confusion_std = mechanism.confusion_noise_std(len(feedback)) if mechanism is not None else 0.0
            confusion_std = held.get("confusion_std", confusion_std)
            return self._released(
                candidates, released.noisy_sums, noise_std, feedback, confusion, confusion_std, errors
            )
        finally:
            held.clear()

    def select(self, candidates: Sequence[CandidateLike], mechanism: SelectionMechanism, label: str) -> list[int]:
        """Indices (into ``candidates``) chosen by a DP selection mechanism on a fresh subsample."""
        candidates = _check_candidates(candidates)
        for attribute in ("event", "select", "sensitivity", "k"):
            if not hasattr(mechanism, attribute):
                raise TypeError(
                    f"mechanism: needs .{attribute}; use ExponentialMechanism, GumbelTopK or PermuteAndFlip"
                )
        if float(mechanism.sensitivity) < self.clip_bound:
            raise ValueError(
                f"mechanism.sensitivity: must be >= the task's clip_bound ({self.clip_bound}), "
                f"got {mechanism.sensitivity}"
            )
        if int(mechanism.k) > len(candidates):
            raise ValueError(f"mechanism.k: must be <= the number of candidates ({len(candidates)}), got {mechanism.k}")
        if adds_noise(self.backend):
            raise ValueError(
                "selection: a selection mechanism reads un-noised totals, which silos that add "
                "their own noise never send; use selection='gaussian' and final_selection='last'"
            )
        charge = self._charge(mechanism, label, candidates, selection_metadata(mechanism))
        if "indices" in charge.journaled:  # released by the interrupted attempt: reuse it
            return [int(i) for i in charge.journaled["indices"]]
        # ---- private data is read only below this line, after the charge ----

        def read() -> list[int]:
            totals = self._totals(candidates, False, rng=charge.sampling_rng(self.sampling_rng))
            self._log_failures(label, totals)
            sums = totals.sums
            indices = [int(i) for i in mechanism.select(sums, charge.noise(self.noise, "selection"))]
            charge.record(indices=indices, complete=True)
            return indices

        return self._read_private(label, read)

    # -- internals --------------------------------------------------------------------
    @staticmethod
    def _check_feedback(feedback_candidates: Sequence[int], num_candidates: int) -> list[int]:
        feedback = []
        for value in feedback_candidates:
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise TypeError(f"feedback_candidates: indices into candidates must be ints, got {value!r}")
            if not 0 <= value < num_candidates:
                raise ValueError(f"feedback_candidates: index {value} is outside [0, {num_candidates})")
            feedback.append(int(value))
        if len(set(feedback)) != len(feedback):
            raise ValueError("feedback_candidates: indices must be unique")
        return feedback

    def _charge(self, mechanism: Any, label: str, candidates: list[CandidateLike], extra: Mapping[str, Any]) -> Charge:
        """Spend the mechanism's own event; its public parameters go into the ledger entry.

        With a journal, the interrupted attempt's entry for exactly this charge is adopted
        instead where that is sound (:meth:`ReplayJournal.charge`).
        """
        metadata = {**(mechanism.metadata() if hasattr(mechanism, "metadata") else {}), **extra}
        metadata.update(
            num_candidates=len(candidates),
            candidate_ids=[str(c.id) for c in candidates],
            clip_bound=self.clip_bound,
            sampling_rate=self.sampling_rate,
            secure_noise=self.noise.secure,
        )
        event = mechanism.event(self.sampling_rate)
        if self.journal is not None:
            inputs = hashlib.sha256(json.dumps([str(c.text) for c in candidates]).encode("utf-8")).hexdigest()
            return self.journal.charge(
                self.ledger, event, label, metadata, replayable=self.replays_exactly, inputs=inputs
            )
        entry = self.ledger.spend(event, label, metadata=metadata)
        return Charge(int(getattr(entry, "index", 0)), label, adopted=False)

    @property
    def replays_exactly(self) -> bool:
        """Whether a charge's scores can be recomputed on a resume as the interrupted attempt
        would have: the backend draws the subsample from the charge's seed, and the engine's
        scores are a deterministic function of prompt and record (greedy generation only). Otherwise a charge whose
        release was not journaled is charged again."""
        return (
            bool(getattr(self.backend, "subsample_from_seed", False))
            and not adds_noise(self.backend)
            and bool(getattr(self.engine, "deterministic_scores", False))
            # a generation task that samples (temperature > 0) gives other outputs on a replay
            and float(getattr(self.task, "temperature", 0.0)) == 0.0
            # a caller's pipeline (tasks.scored) replays only when it says it is deterministic
            and bool(getattr(self.task, "deterministic", True))
        )

    def _released(
        self,
        candidates: list[CandidateLike],
        sums: np.ndarray,
        noise_std: float,
        feedback: list[int],
        confusion: np.ndarray | None,
        confusion_std: float | None,
        errors: tuple[float, float] | None = None,
    ) -> ReleasedScores:
        denominator = self.expected_batch_size  # public q*N, never the realised |B|
        return ReleasedScores(
            candidate_ids=[str(c.id) for c in candidates],
            noisy_sums=sums,
            estimates=sums / denominator,
            noise_std_sum=noise_std,
            noise_std_estimate=noise_std / denominator,
            expected_batch_size=denominator,
            confusion=confusion,
            confusion_candidate_ids=[str(candidates[j].id) for j in feedback] if feedback else None,
            confusion_noise_std=confusion_std,
            secure_noise=self.noise.secure,
            noisy_errors=None if errors is None else float(errors[0]),
            error_noise_std=None if errors is None else float(errors[1]),
        )

    def _log_failures(self, label: str, totals: SubsampleTotals) -> None:
        """Records that failed to score (each scored 0): their count and the first error's text, for
        the operator only; nothing of it is released unless a mechanism charged for the count."""
        if totals.errors and self.operator_log is not None:
            self.operator_log(
                f"{label}: {int(totals.errors)} sampled record(s) failed to score and scored 0; "
                f"first error: {totals.error_detail}"
            )

    @staticmethod
    def _read_private(label: str, read: Any) -> Any:
        """Run ``read`` (which touches private records) behind the error boundary.

        Any failure (an engine that times out, a record over the context, a task bug) is
        rewritten into :class:`PrivateScoringError`, whose message quotes no record and no
        private-derived number. It is raised outside the ``except`` block, so the original
        is neither its cause nor its context and no traceback printer can show it.
        """
        try:
            # Whether a warning fires can depend on the records: none leaves the boundary (the
            # preflight probe on public text shows the engine's own warnings before this).
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return read()
        except Exception as exc:
            failure = PrivateScoringError(label, exc)
        raise failure

    def _totals(
        self, candidates: list[CandidateLike], with_confusion: bool, rng: np.random.Generator | None = None
    ) -> SubsampleTotals:
        """The backend draws the secret Poisson subsample and totals each candidate's clipped scores.

        ``rng``: the charge's own subsample generator, for a backend that takes one."""
        prompts = [str(c.text) for c in candidates]
        if rng is not None and rng is not self.sampling_rng and getattr(self.backend, "subsample_from_seed", False):
            seeded = cast(SeededScoringBackend, self.backend)
            totals = seeded.totals(prompts, self.sampling_rate, self.clip_bound, with_confusion, sampling_rng=rng)
        else:
            totals = self.backend.totals(prompts, self.sampling_rate, self.clip_bound, with_confusion)
        if np.shape(totals.sums) != (len(candidates),):
            raise RuntimeError("scoring backend: returned the wrong number of utility sums")
        return totals


__all__ = ["DPScorer"]
