"""The plan of a run: its calibrated parameter and the mechanisms each generation runs.

The planner and the running generation ask the same question,
``RunPlan.generation_mechanisms(t, ...)``, and get the same mechanism objects back; the
event of the whole run is composed from those objects' own events. So the event that
calibration fitted into (epsilon, delta) is, by construction, the sequence of events the
ledger is charged at run time. Planning touches no data and imports no engine, task or
textgrad. Whether the LLM operators run (and so whether DP feedback is read and charged)
is decided here too, once, before calibration (:func:`decide_llm_operators`).

When N is not declared, the run is two stages (``docs/privacy.md``, "The dataset size"):
a pure-DP count of N (``size_count``), then the search, planned from the noisy count and
calibrated to the rest of the budget. The stages compose by basic composition, which
holds although the search's parameters depend on the count, so the plan's epsilon is the
count's plus the search's (:meth:`RunPlan.epsilons`), exactly what the ledger reports.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import dp_accounting

from dp_textgrad.dp_es.config import ConfigError, DPESConfig, LabellingConfig
from dp_textgrad.dp_es.selector import DPSelector, GenerationMechanisms, strategy_for
from dp_textgrad.privacy.accounting.accountants import Accountant
from dp_textgrad.privacy.accounting.bounds import all_bounds, default_accountants
from dp_textgrad.privacy.accounting.calibration import calibrate_noise_multiplier, calibrate_pure_epsilon
from dp_textgrad.privacy.accounting.ledger import BudgetExceeded
from dp_textgrad.privacy.mechanisms import (
    GaussianScoreMechanism,
    LaplaceCountMechanism,
    SelectionMechanism,
    selection_mechanism,
)
from dp_textgrad.privacy.token_voting import AnsweringPlan, TokenGNMax, calibrate_token_gnmax
from dp_textgrad.privacy.voting import ConfidentGNMax, GNMax, LabellingPlan, VotingMechanism, calibrate_gnmax


def decide_llm_operators(declared: bool | None, instruction_following: bool) -> bool:
    """Whether a run uses the LLM operators (rewrites, crossovers, critiques): the one place this is decided.

    ``declared`` is the configuration's ``llm_operators`` (None: not declared);
    ``instruction_following`` is the engine's declaration (``Engine.instruction_following``, or
    the no-load answer for the engine a run file names). A declared value wins; otherwise the
    operators are on exactly when the engine follows rewrite instructions (a base model
    continues patterns instead). The plan depends on the answer (feedback is charged only
    where an LLM operator reads it), so it is decided before calibration, by
    ``DPEvolutionStrategy`` for a run and by ``dp-textgrad budget`` for its estimate, and the
    resolved configuration carries the bool from then on.
    """
    return bool(instruction_following) if declared is None else bool(declared)


# The budgets calibration supports: tested and timed there (docs/performance.md). Past 1e4 the
# PLD's loss range outgrows floats and calibration slows down (40 s at 1e6) for budgets that
# protect nothing; below 1e-3 the noise drowns every score.
CALIBRATION_EPSILON_RANGE = (1e-3, 1e4)

# Events do not depend on the clip bound or the population size (sensitivities are
# normalised); the planner builds the mechanisms with these stand-ins.
_PLAN_CLIP_BOUND = 1.0


@dataclass(frozen=True)
class RunPlan:
    """A resolved configuration and its calibrated parameter ``value``.

    ``value`` is the noise multiplier z for Gaussian scoring or the per-pick epsilon0 for
    a charged selection (whichever ``strategy.calibrates`` names); None when privacy is off.
    """

    config: DPESConfig
    value: float | None

    @property
    def strategy(self) -> DPSelector:
        return strategy_for(self.config)

    @property
    def noise_multiplier(self) -> float | None:
        return self.value if self.strategy.calibrates == "noise_multiplier" else None

    @property
    def selection_epsilon(self) -> float | None:
        return self.value if self.strategy.calibrates == "epsilon0" else None

    # -- the mechanisms (asked by the planner and by the running generation alike) -------
    def generation_mechanisms(
        self, t: int, num_candidates: int | None = None, clip_bound: float = _PLAN_CLIP_BOUND
    ) -> GenerationMechanisms:
        count = self.config.population if num_candidates is None else num_candidates
        return self.strategy.mechanisms(self.config, self.value, t, count, clip_bound)

    def final(self, clip_bound: float = _PLAN_CLIP_BOUND) -> SelectionMechanism | None:
        """The charged release of the final prompt, or None when it is free ('last')."""
        if self.config.final_selection == "last":
            return None
        return selection_mechanism(self.config.final_selection, self.config.final_epsilon, 1, clip_bound)

    @property
    def final_estimate_noise_multiplier(self) -> float | None:
        """The noise multiplier of the final estimate (calibrated to its share alone), or None without one."""
        settings, rate = self.config.final_estimate, self.config.final_estimate_rate
        if settings is None or rate is None or self.strategy.calibrates is None:
            return None
        return _final_estimate_noise(settings.epsilon_share * self.config.epsilon, self.config.resolved_delta, rate)

    def final_estimate(self, clip_bound: float = _PLAN_CLIP_BOUND) -> GaussianScoreMechanism | None:
        """The fresh DP estimate of the released prompt (one noisy sum at rate ``config.final_estimate_rate``),
        or None when the run has none."""
        z = self.final_estimate_noise_multiplier
        return None if z is None else GaussianScoreMechanism(z, clip_bound, 1)

    @property
    def size_count(self) -> LaplaceCountMechanism | None:
        """The DP count of N that runs first (stage 1), or None when N is declared."""
        epsilon = self.config.size_epsilon
        return LaplaceCountMechanism(epsilon) if epsilon > 0 else None

    @property
    def labelling_sigma(self) -> float | None:
        """The GNMax noise of the labelling phase (calibrated to its share alone), or None without one."""
        settings = self.config.labelling
        if settings is None or self.strategy.calibrates is None:
            return None
        if settings.answers:
            return _answering_sigma(
                settings.epsilon_share * self.config.epsilon,
                self.config.resolved_delta,
                _resolved_queries(self.config),
                settings.answer_steps,
                _resolved_answer_rate(settings),
            )
        return _labelling_sigma(
            settings.epsilon_share * self.config.epsilon,
            self.config.resolved_delta,
            _resolved_queries(self.config),
            settings.threshold_sigma,
        )

    def labelling(self, num_labels: int) -> LabellingPlan | AnsweringPlan | None:
        """The labelling phase over ``num_labels`` labels (the task's), its answering form for a
        generation task, or None when the run has none."""
        settings, sigma = self.config.labelling, self.labelling_sigma
        if settings is None or sigma is None:
            return None
        if settings.teachers is None:
            raise ConfigError("labelling.teachers: not resolved yet (LabellingConfig.resolved fills it from N)")
        if settings.answers:
            return AnsweringPlan(
                _answering_mechanism(settings, sigma), _resolved_queries(self.config), settings.teachers
            )
        return LabellingPlan(
            _voting_mechanism(settings, sigma, num_labels), _resolved_queries(self.config), settings.teachers
        )

    @property
    def labelling_event(self) -> dp_accounting.DpEvent | None:
        """What the labelling phase charges (one entry), or None when the run has none. It depends
        only on the noise and the number of queries, not on the labels or the teachers."""
        settings, sigma = self.config.labelling, self.labelling_sigma
        if settings is None or sigma is None:
            return None
        if settings.answers:
            return _answering_mechanism(settings, sigma).event(_resolved_queries(self.config))
        return _voting_mechanism(settings, sigma, 2).event(_resolved_queries(self.config))

    @property
    def search_event(self) -> dp_accounting.DpEvent:
        """The search (stage 2): every generation's events, then the final release."""
        return self.remaining_event(0)

    @property
    def stage_event(self) -> dp_accounting.DpEvent:
        """Stage 2 as one ledger stage composes it: the labelling phase (if any), then the search."""
        labelling = self.labelling_event
        search = self.search_event
        return search if labelling is None else dp_accounting.ComposedDpEvent([labelling, search])

    @property
    def event(self) -> dp_accounting.DpEvent:
        """The whole run as the ledger charges it: the count of N first when it is not declared,
        then the labelling phase when there is one, then every generation's events and the final
        release (:attr:`search_event`)."""
        count = self.size_count
        stage = self.stage_event
        return stage if count is None else dp_accounting.ComposedDpEvent([count.event(), stage])

    def epsilons(self, delta: float, accountants: list[Accountant] | None = None) -> dict[str, float]:
        """Each accountant's bound on the whole run at ``delta``: the count's pure epsilon plus
        the bound of the labelling and the search composed (basic composition of the two
        stages, as the ledger reports it)."""
        accountants = default_accountants() if accountants is None else accountants
        stage = all_bounds(accountants, [self.stage_event], delta)
        return {name: self.config.size_epsilon + value for name, value in stage.items()}

    def labelling_epsilons(self, delta: float, accountants: list[Accountant] | None = None) -> dict[str, float]:
        """Each accountant's bound on the labelling phase alone at ``delta`` ({} without one)."""
        event = self.labelling_event
        if event is None:
            return {}
        return all_bounds(default_accountants() if accountants is None else accountants, [event], delta)

    def remaining_event(self, start: int) -> dp_accounting.DpEvent:
        """Generations ``start`` .. T-1, then the final release (what a resumed run may still spend)."""
        if self.strategy.calibrates is None:
            return dp_accounting.NonPrivateDpEvent()
        q = self.config.resolved_sampling_rate
        runs: list[list] = []  # consecutive identical generations, self-composed (fast to account)
        for t in range(start, self.config.generations):
            parts = self.generation_mechanisms(t).events(q)
            event = parts[0] if len(parts) == 1 else dp_accounting.ComposedDpEvent(parts)
            if runs and runs[-1][0] == event:
                runs[-1][1] += 1
            else:
                runs.append([event, 1])
        events = [event if count == 1 else dp_accounting.SelfComposedDpEvent(event, count) for event, count in runs]
        return dp_accounting.ComposedDpEvent(events + self._after_search())

    def charges(self) -> list[dp_accounting.DpEvent]:
        """The search's events one per ledger entry, in the order a run charges them: each generation's
        (at full population), then the final selection and the final estimate where planned. A finished
        run's ledger after its count and labelling is exactly this list (the tests check it)."""
        if self.strategy.calibrates is None:
            return []
        q = self.config.resolved_sampling_rate
        events = [event for t in range(self.config.generations) for event in self.generation_mechanisms(t).events(q)]
        return events + self._after_search()

    def _after_search(self) -> list[dp_accounting.DpEvent]:
        """The charges after the last generation, in order: the final selection, the final estimate."""
        events = []
        final = self.final()
        if final is not None:
            events.append(final.event(self.config.resolved_sampling_rate))
        estimate, rate = self.final_estimate(), self.config.final_estimate_rate
        if estimate is not None and rate is not None:
            events.append(estimate.event(rate))
        return events

    def describe(self) -> str:
        return self.strategy.describe(self.value, self.config.parents)

    # -- construction ------------------------------------------------------------------
    @classmethod
    def with_value(cls, config: DPESConfig, value: float | None) -> RunPlan:
        """The plan at a given parameter, without calibrating (resume, ``budget`` accounting)."""
        return cls(config, value)

    @classmethod
    def calibrated(cls, config: DPESConfig) -> RunPlan:
        """Calibrate the free parameter so the whole run fits (epsilon, delta).

        Calibration takes seconds (many PLD evaluations) and depends only on the schedule,
        so it is memoised per schedule within the process.
        """
        if strategy_for(config).calibrates is None:
            return cls(config, None)
        low, high = CALIBRATION_EPSILON_RANGE
        if not low <= config.epsilon <= high:  # the budget as given; the search gets more than half of it
            raise ConfigError(
                f"epsilon: calibration supports {low:g} <= epsilon <= {high:g}, got {config.epsilon:g}; "
                'choose a budget in that range (for a non-private baseline set privacy = "off")'
            )
        labelling = config.labelling
        if labelling is not None and labelling.epsilon_share * config.epsilon >= config.search_epsilon:
            raise ConfigError(
                f"labelling.epsilon_share: {labelling.epsilon_share:g} of epsilon leaves nothing for the search "
                f"after the count of N ({config.size_epsilon_share:g}); lower it, or declare dataset_size"
            )
        estimate = config.final_estimate
        shares = (0.0 if labelling is None else labelling.epsilon_share) + (
            0.0 if estimate is None else estimate.epsilon_share
        )
        if estimate is not None and shares * config.epsilon >= config.search_epsilon:
            raise ConfigError(
                f"final_estimate.epsilon_share: {estimate.epsilon_share:g} of epsilon, with the labelling's share "
                "and the count of N, leaves nothing for the search; lower a share, or declare dataset_size"
            )
        # Stage 2 (labelling, if any, then the search) is calibrated to the budget less the count's:
        # the labelling at its share, the search to what the two composed leave.
        return cls(config, _calibrated_value(_schedule_key(config), config.search_epsilon))


_SCHEDULE_FIELDS = (
    "epsilon",
    "delta",
    "generations",
    "population",
    "parents",
    "sampling_rate",
    "selection",
    "final_selection",
    "final_epsilon",
    "final_estimate",
    "feedback",
    "feedback_noise_ratio",
    "max_error_share",
    "privacy",
    "llm_operators",
    "labelling",
)  # everything the plan's mechanisms depend on


# Fields that change no mechanism of the plan (a test checks the two lists cover DPESConfig).
# The count of N is planned from size_epsilon_share * epsilon, passed to the memo as the search's target.
PLAN_INDEPENDENT_FIELDS = frozenset(
    {
        "elites",
        "mode",
        "unsafe_examples",
        "shrinkage",
        "use_critiques",
        "seed",
        "insecure_noise_seed",
        "max_prompt_chars",
        "dataset_size",
        "max_record_tokens",
        "long_records",
        "size_epsilon_share",
        "counted_dataset_size",
        "warmup_generations",
        "max_private_evaluations",  # decides sampling_rate when it is 'auto' (resolve_sampling_rate), no more
    }
)


def _schedule_key(config: DPESConfig) -> tuple:
    return tuple((name, getattr(config, name)) for name in _SCHEDULE_FIELDS)


@functools.lru_cache(maxsize=64)
def _calibrated_value(key: tuple, search_epsilon: float) -> float:
    config = DPESConfig(**dict(key))
    calibrate = (
        calibrate_noise_multiplier if strategy_for(config).calibrates == "noise_multiplier" else calibrate_pure_epsilon
    )
    try:  # stage 2: the labelling phase (fixed by its share) and the search, composed
        return calibrate(lambda x: RunPlan(config, x).stage_event, search_epsilon, config.resolved_delta)
    except BudgetExceeded:
        raise
    except (ValueError, RuntimeError) as exc:
        raise ConfigError(
            f"epsilon: cannot fit the planned schedule into epsilon={config.epsilon}, delta={config.delta} "
            f"({exc}); raise epsilon or lower generations/final_epsilon"
        ) from None


# -- the sampling rate: planned, not guessed ---------------------------------------------------------
def mean_noise_std(plan: RunPlan) -> float:
    """The standard deviation of the DP noise on one candidate's mean score estimate (in units of
    the clip bound C): z C sqrt(K) / (q N) for Gaussian scores; for a charged selection, the std of
    its Gumbel (or exponential) noise on a mean, pi / sqrt(6) x C / (eps0 q N). Public: a function
    of the schedule and the declared (or DP-counted) N."""
    config = plan.config
    size = config.public_dataset_size
    if size is None or plan.value is None:
        return 0.0 if plan.value is None and size is not None else math.nan
    batch = config.resolved_sampling_rate * size
    mechanisms = plan.generation_mechanisms(0)
    if mechanisms.scores is not None:
        return float(mechanisms.scores.noise_std) / batch
    return math.pi / math.sqrt(6.0) / (float(plan.value) * batch)


def sampling_std_bound(config: DPESConfig) -> float:
    """A public bound on the subsampling error of a mean score estimate (units of C): a Poisson
    subsample of rate q divided by q N has variance sum_i s_i^2 (1 - q) / (q N)^2 <= (1 - q) / (q N)."""
    size = config.public_dataset_size
    q = config.resolved_sampling_rate
    if size is None:
        return math.nan
    return math.sqrt(max(0.0, 1.0 - q) / (q * size))


def final_estimate_std(plan: RunPlan) -> tuple[float, float] | None:
    """The final estimate's DP noise std and its public subsampling bound on a mean score (units of
    C), or None without a final estimate: z_f C / (q_f N) and sqrt((1 - q_f) / (q_f N)). Public."""
    z, rate = plan.final_estimate_noise_multiplier, plan.config.final_estimate_rate
    size = plan.config.public_dataset_size
    if z is None or rate is None:
        return None
    if size is None:
        return math.nan, math.nan
    batch = rate * size
    return z / batch, math.sqrt(max(0.0, 1.0 - rate) / batch)


def final_evaluations(plan: RunPlan) -> float:
    """Planned private record evaluations after the search: a charged final selection's q N K and the
    final estimate's q_f N (N the declared or DP-counted size; 0 when neither is planned). Public."""
    config = plan.config
    size = config.public_dataset_size
    if size is None:
        return math.nan
    total = config.resolved_sampling_rate * size * config.population if plan.final() is not None else 0.0
    rate = config.final_estimate_rate
    if rate is not None and plan.final_estimate() is not None:
        total += rate * size
    return total


def mean_score_std(plan: RunPlan) -> float:
    """The std of one candidate's mean score estimate: the DP noise and the subsampling bound together."""
    return math.hypot(mean_noise_std(plan), sampling_std_bound(plan.config))


def ranking_probability(plan: RunPlan, margin: float) -> float:
    """The probability that one generation ranks the best of its K candidates first when its true
    mean score leads every other candidate's by ``margin`` (units of C; the others tied: the worst
    case for a given margin). Gaussian scores: the estimates differ by independent errors of std
    :func:`mean_score_std` (noise and subsampling), P = int phi(t) Phi(t + margin / std)^(K - 1) dt.
    A charged selection: the exponential mechanism's own odds on the expected sums,
    1 / (1 + (K - 1) exp(-eps0 margin q N / C)) (its subsampling error left out). Public."""
    from scipy import integrate, stats

    if not (math.isfinite(margin) and margin >= 0):
        raise ValueError(f"margin: must be a finite number >= 0, got {margin}")
    config = plan.config
    others = config.population - 1
    if plan.value is not None and plan.generation_mechanisms(0).scores is None:  # a charged selection
        size = config.public_dataset_size
        if size is None:
            return math.nan
        lead = float(plan.value) * margin * config.resolved_sampling_rate * size
        return 1.0 / (1.0 + others * math.exp(-lead))
    std = mean_score_std(plan)
    if not math.isfinite(std):
        return math.nan
    if std == 0.0:
        return 1.0 if margin > 0 else 1.0 / config.population
    shift = margin / std

    def density(t: float) -> float:
        return float(stats.norm.pdf(t) * stats.norm.cdf(t + shift) ** others)

    value, _ = integrate.quad(density, -12.0, 12.0, limit=200)
    return min(1.0, max(0.0, float(value)))


def resolve_sampling_rate(config: DPESConfig) -> DPESConfig:
    """``config`` (N declared or counted, delta filled in) with ``sampling_rate: auto`` planned, and
    a given q checked against ``max_private_evaluations``.

    Auto: among q_max, q_max / 2, q_max / 4 and q_max / 8 (q_max = the largest q whose planned
    evaluations q N K T fit the cap, at most 1), the q whose calibrated plan gives a candidate's mean
    score the smallest std, DP noise and subsampling bound together (:func:`mean_score_std`; a tie
    goes to the smaller, cheaper q). Each candidate q is calibrated to the same budget, so the noise
    is the plan's own. Public inputs only: the budget, the schedule and the public N.
    """
    size = config.public_dataset_size
    if size is None:
        raise ConfigError("sampling_rate: resolve the configuration's N (declared, or the DP count) first")
    per_q = size * config.population * config.generations  # planned evaluations at q = 1
    if not config.auto_sampling_rate:
        planned = config.resolved_sampling_rate * per_q
        cap = config.max_private_evaluations
        if cap is not None and planned > cap * (1 + 1e-12):
            raise ConfigError(
                f"max_private_evaluations: the schedule plans about {planned:.0f} private record evaluations "
                f"(q N K T), over the cap of {cap}; lower sampling_rate, generations or population, or raise the cap"
            )
        return config
    top = min(1.0, config.evaluation_cap / per_q)
    if top * size < 1.0:
        raise ConfigError(
            f"max_private_evaluations: {config.evaluation_cap} planned evaluations leave less than one record per "
            f"candidate and generation (N = {size}, K = {config.population}, T = {config.generations}); raise it"
        )
    candidates = sorted({top / 2**i for i in range(4) if top / 2**i * size >= 1.0})
    scored = []
    for q in candidates:
        trial = config.model_copy(update={"sampling_rate": q})
        if strategy_for(trial).calibrates is None:  # privacy off: no noise, the subsampling alone
            scored.append((sampling_std_bound(trial), q))
            continue
        scored.append((mean_score_std(RunPlan.calibrated(trial)), q))
    _, best = min(scored)
    return config.model_copy(update={"sampling_rate": best})


def _voting_mechanism(settings: LabellingConfig, sigma: float, num_labels: int) -> VotingMechanism:
    if settings.threshold is None or settings.threshold_sigma is None:
        return GNMax(sigma, num_labels)
    return ConfidentGNMax(settings.threshold, settings.threshold_sigma, sigma, num_labels)


def _resolved_queries(config: DPESConfig) -> int:
    queries = None if config.labelling is None else config.labelling.queries
    if queries is None:
        raise ConfigError(
            "labelling.queries: not resolved yet (LabellingConfig.resolved fills it from the task's public inputs)"
        )
    return queries


def _resolved_answer_rate(settings: LabellingConfig) -> float:
    if settings.sampling_rate is None:
        raise ConfigError(
            "labelling.sampling_rate: not resolved yet (LabellingConfig.resolved fills it from N for a generation task)"
        )
    return settings.sampling_rate


def _answering_mechanism(settings: LabellingConfig, sigma: float) -> TokenGNMax:
    assert settings.answer_steps is not None  # settings.answers
    return TokenGNMax(sigma, settings.answer_steps, _resolved_answer_rate(settings))


@functools.lru_cache(maxsize=64)
def _final_estimate_noise(epsilon: float, delta: float, rate: float) -> float:
    try:
        return calibrate_noise_multiplier(
            lambda z: GaussianScoreMechanism(z, _PLAN_CLIP_BOUND, 1).event(rate), epsilon, delta
        )
    except ValueError as exc:
        raise ConfigError(
            f"final_estimate: cannot fit one Gaussian estimate into its share epsilon={epsilon:g} ({exc}); "
            "raise final_estimate.epsilon_share"
        ) from None


@functools.lru_cache(maxsize=64)
def _answering_sigma(epsilon: float, delta: float, queries: int, max_tokens: int, rate: float) -> float:
    try:
        return calibrate_token_gnmax(epsilon, delta, queries, max_tokens, rate)
    except ValueError as exc:
        raise ConfigError(
            f"labelling: cannot fit {queries} DP answers of {max_tokens} vote steps into their share "
            f"epsilon={epsilon:g} "
            f"({exc}); raise labelling.epsilon_share, or answer fewer inputs (labelling.queries) or shorter "
            "(labelling.max_answer_tokens)"
        ) from None


@functools.lru_cache(maxsize=64)
def _labelling_sigma(epsilon: float, delta: float, queries: int, threshold_sigma: float | None) -> float:
    try:
        return calibrate_gnmax(epsilon, delta, queries, threshold_sigma=threshold_sigma)
    except ValueError as exc:
        raise ConfigError(
            f"labelling: cannot fit {queries} teacher votes into their share epsilon={epsilon:g} ({exc}); "
            "raise labelling.epsilon_share or label fewer inputs (labelling.queries)"
        ) from None


__all__ = [
    "CALIBRATION_EPSILON_RANGE",
    "RunPlan",
    "decide_llm_operators",
    "final_estimate_std",
    "final_evaluations",
    "mean_noise_std",
    "mean_score_std",
    "ranking_probability",
    "resolve_sampling_rate",
    "sampling_std_bound",
]
