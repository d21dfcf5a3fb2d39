"""L1 mechanism-level audits: many cheap runs on neighbouring datasets, one guess per run.

Neighbouring datasets (add/remove one record): D, and D plus one *canary* record that
maximally favours one candidate (clipped score C for it, 0 for every other; for the
Gaussian scorer optionally C for every candidate, the worst case of its L2
sensitivity). D is represented by public baseline utility sums ``u``: a
data-independent offset changes no sensitivity, so the guarantee for D = {} with
utilities ``u + sums`` is the guarantee of the mechanism itself. With Poisson
subsampling (q < 1) the canary is included with probability q in each run of the
"with canary" arm, so the audit measures the amplified mechanism the ledger charges.

Each audit returns a :class:`MechanismAuditResult`:

- ``claimed_epsilon``: what the library's own accountants (all five, smallest valid
  bound, :func:`dp_textgrad.privacy.accounting.smallest_bound`) say about the
  mechanism's ``.event(q)`` at ``delta``;
- ``eps_lb``: a (1 - alpha)-confidence Clopper-Pearson lower bound from
  :mod:`dp_textgrad.audit.bounds`, thresholds never tuned on the evaluated scores
  (a fixed threshold for yes/no statistics, a held-out half for continuous ones);
- ``positive_control_eps_lb``: the same audit with the noise switched off. It must
  be large, or the audit could not have seen a violation.

``eps_lb > claimed_epsilon`` is a violation: the mechanism, its accounting or the
code between them is wrong (with probability at most alpha it is a false alarm).
A small ``eps_lb`` proves nothing. The ``actual_noise_factor`` argument releases
with a different noise scale than the one declared (and charged): a deliberately
broken mechanism, for checking that the audit can fail.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import dp_accounting
import numpy as np

from dp_textgrad.audit.bounds import EpsilonLowerBound, eps_lower_bound_from_scores
from dp_textgrad.privacy.accounting import smallest_bound
from dp_textgrad.privacy.noise import NoiseSource
from dp_textgrad.privacy.mechanisms import GaussianScoreMechanism
from dp_textgrad.privacy.mechanisms import ExponentialMechanism, GumbelTopK

# Baseline utility sum of every candidate on D (its value is irrelevant; ties are avoided below).
_BASELINE = 5.0
# "Noise off" for the exponential mechanism: eps0 so large that it is an exact argmax.
_NOISE_OFF_EPSILON0 = 1e6
# A positive control must reach at least this at 1000 runs per arm (see docs/audit.md).
POSITIVE_CONTROL_FLOOR = 3.0


class _ScaledNoise(NoiseSource):
    """BROKEN ON PURPOSE (audit controls only): Gaussian and Gumbel noise times ``factor``."""

    __slots__ = ("_factor",)

    def __init__(self, insecure_seed: int, factor: float) -> None:
        super().__init__(insecure_seed=insecure_seed)
        self._factor = factor

    def normal(self, scale: float, size: Any = None) -> Any:
        return super().normal(scale * self._factor, size)

    def gumbel(self, scale: float, size: Any = None) -> Any:
        return super().gumbel(scale * self._factor, size)


class _NoiseOff(NoiseSource):
    """POSITIVE CONTROL ONLY: Gaussian and Gumbel noise are exactly zero."""

    __slots__ = ()

    def normal(self, scale: float, size: Any = None) -> Any:
        return np.zeros(size) if size is not None else 0.0

    def gumbel(self, scale: float, size: Any = None) -> Any:
        return np.zeros(size) if size is not None else 0.0


@dataclass(frozen=True)
class MechanismAuditResult:
    """Claimed epsilon vs empirical lower bound (and the noise-off positive control)."""

    name: str
    claimed_epsilon: float
    delta: float
    alpha: float
    sampling_rate: float
    runs_per_arm: int
    eps_lb: float
    bound: EpsilonLowerBound
    positive_control_eps_lb: float | None
    positive_control: EpsilonLowerBound | None
    seconds: float
    parameters: dict[str, Any] = field(default_factory=dict)
    note: str = ""

    @property
    def violation(self) -> bool:
        """True when the lower bound exceeds the claim: the claim cannot be right."""
        return self.eps_lb > self.claimed_epsilon

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["violation"] = self.violation
        return out


# -- shared pieces ----------------------------------------------------------------------


def _check_runs(runs: int) -> int:
    if isinstance(runs, bool) or not isinstance(runs, (int, np.integer)) or runs < 20:
        raise ValueError(f"runs: must be an integer >= 20 (runs per arm), got {runs!r}")
    return int(runs)


def _check_rate(q: float) -> float:
    q = float(q)
    if not (math.isfinite(q) and 0.0 < q <= 1.0):
        raise ValueError(f"sampling_rate: q must be in (0, 1], got {q}")
    return q


def _check_factor(factor: float) -> float:
    factor = float(factor)
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"actual_noise_factor: must be a finite number > 0, got {factor}")
    return factor


def claimed_epsilon(event: dp_accounting.DpEvent, delta: float) -> float:
    """The library's claim for ``event``: the smallest valid bound of the default accountants."""
    return float(smallest_bound([event], delta))


def _canary_included(runs: int, q: float, rng: np.random.Generator) -> np.ndarray:
    """Per run of the "with canary" arm: was the canary in the secret Poisson subsample?"""
    return np.ones(runs, dtype=bool) if q == 1.0 else rng.random(runs) < q


def _binary_bound(member_hits: np.ndarray, nonmember_hits: np.ndarray, delta: float,
                  alpha: float) -> EpsilonLowerBound:
    """Yes/no statistic: one threshold (0.5), fixed before the runs."""
    return eps_lower_bound_from_scores(member_hits.astype(float), nonmember_hits.astype(float), delta, alpha,
                                       "bonferroni", thresholds=[0.5])


def _continuous_bound(member_scores: np.ndarray, nonmember_scores: np.ndarray, delta: float, alpha: float,
                      seed: int) -> EpsilonLowerBound:
    """Continuous statistic: threshold chosen on a seeded half, bound on the other half."""
    return eps_lower_bound_from_scores(member_scores, nonmember_scores, delta, alpha, 0.5, seed=seed)


def _seeds(seed: int) -> tuple[NoiseSource, NoiseSource, np.random.Generator]:
    # Reproducible (insecure) noise is right for an audit: the auditor is not the adversary.
    return (NoiseSource(insecure_seed=4 * seed + 1), NoiseSource(insecure_seed=4 * seed + 2),
            np.random.default_rng(4 * seed + 3))


# -- the Gaussian noisy-score mechanism ---------------------------------------------------


def audit_gaussian_scores(
    *,
    noise_multiplier: float = 2.0,
    num_candidates: int = 4,
    clip_bound: float = 1.0,
    sampling_rate: float = 1.0,
    runs: int = 2000,
    delta: float = 1e-5,
    alpha: float = 0.05,
    favour: Literal["one", "all"] = "all",
    actual_noise_factor: float = 1.0,
    positive_control: bool = True,
    seed: int = 0,
) -> MechanismAuditResult:
    """Audit :class:`GaussianScoreMechanism` (all K noisy sums) on D vs D + canary.

    The canary adds C to candidate 0 (``favour="one"``) or to every candidate
    (``"all"``, the worst case: shift C*sqrt(K) in L2). The statistic is the release
    projected on that shift, the most powerful test for a Gaussian.
    """
    runs, q, factor = _check_runs(runs), _check_rate(sampling_rate), _check_factor(actual_noise_factor)
    if favour not in ("one", "all"):
        raise ValueError(f"favour: use 'one' or 'all', got {favour!r}")
    started = time.perf_counter()
    declared = GaussianScoreMechanism(noise_multiplier, clip_bound, num_candidates)
    claim = claimed_epsilon(declared.event(q), delta)
    released_by = GaussianScoreMechanism(noise_multiplier * factor, clip_bound, num_candidates)
    u = np.full(num_candidates, _BASELINE)
    shift = clip_bound * (np.ones(num_candidates) if favour == "all" else np.eye(num_candidates)[0])
    direction = shift / np.linalg.norm(shift)

    def arm_scores(mechanism: GaussianScoreMechanism, noise_d: NoiseSource, noise_plus: NoiseSource,
                   rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        included = _canary_included(runs, q, rng)
        sums_plus = u[None, :] + included[:, None] * shift[None, :]
        without = (mechanism.release(np.tile(u, (runs, 1)), noise_d) - u) @ direction
        with_canary = (mechanism.release(sums_plus, noise_plus) - u) @ direction
        return with_canary, without

    noise_d, noise_plus, rng = _seeds(seed)
    members, nonmembers = arm_scores(released_by, noise_d, noise_plus, rng)
    bound = _continuous_bound(members, nonmembers, delta, alpha, seed)
    control = None
    if positive_control:
        _, _, rng = _seeds(seed)
        members, nonmembers = arm_scores(released_by, _NoiseOff(0), _NoiseOff(0), rng)
        control = _continuous_bound(members, nonmembers, delta, alpha, seed)
    return MechanismAuditResult(
        name="gaussian_scores", claimed_epsilon=claim, delta=delta, alpha=alpha, sampling_rate=q,
        runs_per_arm=runs, eps_lb=bound.epsilon, bound=bound,
        positive_control_eps_lb=None if control is None else control.epsilon, positive_control=control,
        seconds=time.perf_counter() - started,
        parameters={"noise_multiplier": float(noise_multiplier), "num_candidates": num_candidates,
                    "clip_bound": float(clip_bound), "favour": favour, "actual_noise_factor": factor, "seed": seed},
        note="statistic: release projected on the canary's shift; threshold on a held-out half",
    )


# -- selection mechanisms ----------------------------------------------------------------


def _selection_audit(
    name: str,
    make: Callable[[float], Any],
    epsilon0: float,
    num_candidates: int,
    sensitivity: float,
    sampling_rate: float,
    runs: int,
    delta: float,
    alpha: float,
    actual_noise_factor: float,
    positive_control: bool,
    control_mechanism: Callable[[], tuple[Any, NoiseSource | None]],
    seed: int,
    parameters: dict[str, Any],
) -> MechanismAuditResult:
    """Candidate 0 trails the others by C/2 on D and leads by C/2 on D + canary.

    The statistic is "candidate 0 released first" (one fixed threshold).
    """
    runs, q, factor = _check_runs(runs), _check_rate(sampling_rate), _check_factor(actual_noise_factor)
    if num_candidates < 2:
        raise ValueError(f"num_candidates: need at least 2 candidates to select among, got {num_candidates}")
    started = time.perf_counter()
    declared = make(epsilon0)
    claim = claimed_epsilon(declared.event(q), delta)
    u = np.full(num_candidates, _BASELINE)
    u[0] -= 0.5 * sensitivity  # ties never decide

    def hits(mechanism: Any, noise_d: NoiseSource, noise_plus: NoiseSource,
             rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        included = _canary_included(runs, q, rng)
        without = mechanism.sample(u, noise_d, runs)[:, 0] == 0
        u_plus = u.copy()
        u_plus[0] += sensitivity
        # Runs whose subsample missed the canary see D's utilities.
        picks_in = mechanism.sample(u_plus, noise_plus, runs)[:, 0] == 0
        picks_out = mechanism.sample(u, noise_plus, runs)[:, 0] == 0
        return np.where(included, picks_in, picks_out), without

    noise_d, noise_plus, rng = _seeds(seed)
    members, nonmembers = hits(make(epsilon0 / factor), noise_d, noise_plus, rng)
    bound = _binary_bound(members, nonmembers, delta, alpha)
    control = None
    if positive_control:
        mechanism, off = control_mechanism()
        noise_d, noise_plus, rng = _seeds(seed)
        members, nonmembers = hits(mechanism, off or noise_d, off or noise_plus, rng)
        control = _binary_bound(members, nonmembers, delta, alpha)
    return MechanismAuditResult(
        name=name, claimed_epsilon=claim, delta=delta, alpha=alpha, sampling_rate=q, runs_per_arm=runs,
        eps_lb=bound.epsilon, bound=bound,
        positive_control_eps_lb=None if control is None else control.epsilon, positive_control=control,
        seconds=time.perf_counter() - started,
        parameters={"epsilon0": float(epsilon0), "num_candidates": num_candidates,
                    "sensitivity": float(sensitivity), "actual_noise_factor": factor, "seed": seed, **parameters},
        note="statistic: candidate 0 released first; one pre-registered threshold",
    )


def audit_exponential(
    *,
    epsilon0: float = 1.0,
    num_candidates: int = 4,
    sensitivity: float = 1.0,
    sampling_rate: float = 1.0,
    runs: int = 2000,
    delta: float = 1e-5,
    alpha: float = 0.05,
    actual_noise_factor: float = 1.0,
    positive_control: bool = True,
    seed: int = 0,
) -> MechanismAuditResult:
    """Audit :class:`ExponentialMechanism` (noise off: eps0 = 1e6, an exact argmax)."""
    return _selection_audit(
        "exponential", lambda e: ExponentialMechanism(e, sensitivity), epsilon0, num_candidates, sensitivity,
        sampling_rate, runs, delta, alpha, actual_noise_factor, positive_control,
        lambda: (ExponentialMechanism(_NOISE_OFF_EPSILON0, sensitivity), None), seed, {},
    )


def audit_gumbel_topk(
    *,
    epsilon0: float = 0.5,
    k: int = 2,
    num_candidates: int = 6,
    sensitivity: float = 1.0,
    sampling_rate: float = 0.5,
    runs: int = 2000,
    delta: float = 1e-5,
    alpha: float = 0.05,
    actual_noise_factor: float = 1.0,
    positive_control: bool = True,
    seed: int = 0,
) -> MechanismAuditResult:
    """Audit one-shot :class:`GumbelTopK` under Poisson subsampling (default q = 0.5).

    Noise off: the same mechanism with zero Gumbel noise (an exact top-k).
    """
    return _selection_audit(
        "gumbel_top_k", lambda e: GumbelTopK(e, k, sensitivity), epsilon0, num_candidates, sensitivity,
        sampling_rate, runs, delta, alpha, actual_noise_factor, positive_control,
        lambda: (GumbelTopK(epsilon0, k, sensitivity), _NoiseOff(0)), seed, {"k": k},
    )


# -- a whole controller loop -------------------------------------------------------------

_CANARY_TEXT = "audit canary record"
_TRAILING_TEXT = "audit baseline record 0"


class _RecordingLedger:
    """Records every charged event; the claim is computed once from them afterwards.

    The real :class:`PrivacyLedger` re-runs five accountants on every spend (about
    0.25 s); the audit needs thousands of runs, so it records the events and asks the
    same accountants once. Every run must charge the same events (checked).
    """

    def __init__(self, epsilon_budget: float, delta: float) -> None:
        self.epsilon_budget = epsilon_budget
        self.delta = delta
        self.events: list[dp_accounting.DpEvent] = []
        self.unsafe = False

    def spend(self, event: dp_accounting.DpEvent, label: str, metadata: Any = None) -> None:
        self.events.append(event)

    def epsilon(self) -> float:
        return math.nan  # not computed per run (see class docstring)

    def epsilons(self) -> dict[str, float]:
        return {}

    def mark_unsafe(self, reason: str) -> None:
        self.unsafe = True


def _audit_task(seed_prompt: str, n_background: int, clip_bound: float) -> Any:
    """A tiny task whose per-record score is a table: the canary gives C to the seed prompt.

    D: ``n_background`` records scoring C/2 for every candidate, except one record that
    scores 0 for the seed prompt (so the seed trails by C/2 and never wins a tie).
    The canary scores C for the seed prompt and 0 for every other candidate.
    """
    from dp_textgrad.privacy.data import PrivateDataset
    from dp_textgrad.tasks.base import ClassificationTask, Example, RecordOutcomes

    @dataclass
    class _TableTask(ClassificationTask):
        favoured: str = seed_prompt

        def private_outcomes(self, engine: Any, prompt: str, batch: Any, verbalizers: Any = None) -> Any:
            texts = [record.unwrap().text for record in batch]  # inside the DP scorer only
            is_seed = prompt == self.favoured
            scores = np.array([
                (self.clip_bound if is_seed else 0.0) if text == _CANARY_TEXT
                else (0.0 if (is_seed and text == _TRAILING_TEXT) else 0.5 * self.clip_bound)
                for text in texts
            ])
            labels = np.zeros(len(texts), dtype=int)
            return RecordOutcomes(scores=scores, gold=labels, predicted=labels)

    records = [Example(f"audit baseline record {i}", "yes") for i in range(n_background)]

    def make(with_canary: bool) -> Any:
        private = records + ([Example(_CANARY_TEXT, "yes")] if with_canary else [])
        return _TableTask(name="audit-table", description="Answer yes or no.", labels=["yes", "no"],
                          private_train=PrivateDataset(private), test=[], clip_bound=clip_bound,
                          seed_prompt=seed_prompt)

    return make


def audit_controller_loop(
    *,
    epsilon: float = 2.0,
    delta: float = 1e-5,
    generations: int = 2,
    population: int = 3,
    parents: int = 1,
    selection: Literal["gaussian", "exponential"] = "gaussian",
    n_background: int = 20,
    runs: int = 300,
    alpha: float = 0.05,
    actual_noise_factor: float = 1.0,
    positive_control: bool = True,
    seed: int = 0,
) -> MechanismAuditResult:
    """Audit the real DP-ES loop (``EvolutionController``) with the tests-only ScriptedEngine.

    Calibration runs once (``DPEvolutionStrategy`` builds the plan); each run then
    builds a fresh controller with the calibrated parameters, its own noise seed and a
    recording ledger, and runs every generation. Guess "member" iff the released
    prompt is the seed prompt (the candidate the canary favours). The claim is the
    library's bound on the events the runs actually charged (checked equal across runs).
    Noise off: the controller's noise source is replaced by one with zero noise;
    ``actual_noise_factor`` scales the released noise without changing what is charged.
    """
    from dp_textgrad._textgrad import import_textgrad
    from dp_textgrad.dp_es.controller import DPEvolutionStrategy, EvolutionController
    from dp_textgrad.engines.scripted import ScriptedEngine

    runs, factor = _check_runs(runs), _check_factor(actual_noise_factor)
    if selection not in ("gaussian", "exponential"):
        raise ValueError(f"selection: use 'gaussian' or 'exponential', got {selection!r}")
    # q = 1: with q < 1 the background record that makes the seed trail would itself be
    # subsampled and the noise-off control would lose its power (subsampling is audited
    # at the mechanism level instead).
    q = 1.0
    started = time.perf_counter()
    tg = import_textgrad()
    seed_prompt = "Answer the question."
    make_task = _audit_task(seed_prompt, n_background, 1.0)
    tasks = {False: make_task(False), True: make_task(True)}
    engine = ScriptedEngine()
    settings = dict(epsilon=epsilon, delta=delta, generations=generations, population=population, parents=parents,
                    selection=selection, sampling_rate=q, use_critiques=False, seed=seed,
                    # DP confusion feedback rides on Gaussian scoring only.
                    feedback="dp_confusion" if selection == "gaussian" else "none")
    planner = DPEvolutionStrategy([tg.Variable(seed_prompt, role_description="system prompt", requires_grad=True)],
                                  task=tasks[True], engine=engine, **settings)
    config = planner.config
    charged_by_first_run: list[dp_accounting.DpEvent] = []

    def one_run(task: Any, noise_seed: int, noise_off: bool) -> bool:
        variable = tg.Variable(seed_prompt, role_description="system prompt", requires_grad=True)
        ledger = _RecordingLedger(config.epsilon, config.delta)
        run_config = config.model_copy(update={"insecure_noise_seed": noise_seed})
        controller = EvolutionController(
            [variable], task=task, engine=engine, config=run_config, ledger=ledger,  # type: ignore[arg-type]
            noise_multiplier=planner.noise_multiplier, selection_epsilon=planner.selection_epsilon,
        )
        if noise_off or factor != 1.0:
            replaced = _NoiseOff(noise_seed) if noise_off else _ScaledNoise(noise_seed, factor)
            controller.noise = controller.scorer.noise = replaced
            controller.scorer.sampling_rng = replaced.sampling_generator
        result = controller.run()
        if not charged_by_first_run:
            charged_by_first_run.extend(ledger.events)
        elif [repr(e) for e in ledger.events] != [repr(e) for e in charged_by_first_run]:
            raise RuntimeError("audit_controller_loop: runs charged different events; the claim would not apply")
        return result.prompt == seed_prompt

    def arms(noise_off: bool) -> tuple[np.ndarray, np.ndarray]:
        base = 1_000_000 * (seed + 1) + (500_000 if noise_off else 0)
        members = np.array([one_run(tasks[True], base + 2 * i, noise_off) for i in range(runs)])
        nonmembers = np.array([one_run(tasks[False], base + 2 * i + 1, noise_off) for i in range(runs)])
        return members, nonmembers

    members, nonmembers = arms(noise_off=False)
    bound = _binary_bound(members, nonmembers, delta, alpha)
    control = _binary_bound(*arms(noise_off=True), delta, alpha) if positive_control else None
    # The claim: the default accountants on what every run actually charged.
    claim = float(smallest_bound(charged_by_first_run, delta))
    return MechanismAuditResult(
        name=f"controller_loop_{selection}", claimed_epsilon=claim, delta=float(config.delta), alpha=alpha,
        sampling_rate=q, runs_per_arm=runs, eps_lb=bound.epsilon, bound=bound,
        positive_control_eps_lb=None if control is None else control.epsilon, positive_control=control,
        seconds=time.perf_counter() - started,
        parameters={"budget_epsilon": float(config.epsilon), "generations": generations, "population": population,
                    "parents": parents, "selection": selection, "n_background": n_background,
                    "noise_multiplier": planner.noise_multiplier, "selection_epsilon": planner.selection_epsilon,
                    "feedback": config.feedback, "use_critiques": False, "actual_noise_factor": factor,
                    "seed": seed},
        note="statistic: the released prompt is the one the canary favours; real EvolutionController, "
             "ScriptedEngine, calibration once, recording ledger",
    )


AUDITS: dict[str, Callable[..., MechanismAuditResult]] = {
    "gaussian_scores": audit_gaussian_scores,
    "exponential": audit_exponential,
    "gumbel_top_k": audit_gumbel_topk,
    "controller_loop": audit_controller_loop,
    "controller_loop_exponential": lambda **kw: audit_controller_loop(selection="exponential", **kw),
}


def run_mechanism_audits(runs: int = 2000, controller_runs: int = 300, *, delta: float = 1e-5,
                         alpha: float = 0.05, seed: int = 0,
                         only: Sequence[str] | None = None) -> list[MechanismAuditResult]:
    """All L1 audits at default parameters (``only``: a subset of :data:`AUDITS` names)."""
    names = list(AUDITS) if only is None else list(only)
    unknown = [n for n in names if n not in AUDITS]
    if unknown:
        raise ValueError(f"only: unknown audit(s) {unknown}; choose from {sorted(AUDITS)}")
    results = []
    for name in names:
        n = controller_runs if name.startswith("controller_loop") else runs
        results.append(AUDITS[name](runs=n, delta=delta, alpha=alpha, seed=seed))
    return results


__all__ = [
    "AUDITS",
    "POSITIVE_CONTROL_FLOOR",
    "MechanismAuditResult",
    "audit_controller_loop",
    "audit_exponential",
    "audit_gaussian_scores",
    "audit_gumbel_topk",
    "claimed_epsilon",
    "run_mechanism_audits",
]
