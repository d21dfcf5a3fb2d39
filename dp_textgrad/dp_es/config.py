"""Validated configuration of a DP-ES run (the user-facing edge: pydantic)."""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

SelectionKind = Literal["gaussian", "exponential", "permute_and_flip"]
FeedbackKind = Literal["none", "dp_confusion"]
FeedbackMode = Literal["public", "unsafe"]
FinalSelection = Literal["last", "exponential", "permute_and_flip"]
PrivacyKind = Literal["dp", "off"]
LongRecords = Literal["truncate", "reject"]

DEFAULT_EXPECTED_BATCH = 150
# ``sampling_rate: auto`` without ``max_private_evaluations``: at most this many planned record
# evaluations per candidate and generation (q N), four times the default's, so that auto trades noise
# for a bounded cost (docs/privacy.md, "Planning the sampling rate").
AUTO_RECORDS_PER_GENERATION = 600
DEFAULT_LABELLING_QUERIES = 16
DEFAULT_LABELLING_SHARE = 0.5
DEFAULT_MAX_ANSWER_TOKENS = 32
DEFAULT_TEACHER_DEMOS = 6
# Generation teachers show fewer records each: the vote's margin is the number of teachers, and on the
# built-in extraction task two demonstrations already let a teacher copy the answer (docs/benchmarks.md).
DEFAULT_ANSWER_DEMOS = 2
# The default delta when N is not declared: it must not depend on the private count.
DEFAULT_DELTA = 1e-5


class ConfigError(ValueError):
    """A configuration value is invalid. The message names the field and the fix."""


def format_validation_error(error: ValidationError) -> str:
    """One line per problem: ``field: message``."""
    parts = []
    for item in error.errors():
        where = ".".join(str(x) for x in item.get("loc", ())) or "config"
        message = str(item.get("msg", "invalid value")).removeprefix("Value error, ")
        parts.append(f"{where}: {message}")
    return "; ".join(parts)


def config_with(config: DPESConfig | None, settings: Mapping[str, Any]) -> DPESConfig:
    """``config`` (None: the defaults) with ``settings`` (DPESConfig fields) over it, validated together.

    Raises :class:`ConfigError` naming each bad or unknown field. The one way the Python
    entries (``DPEvolutionStrategy``, ``dp_textgrad.optimize``) merge a config and keywords.
    """
    if config is not None and not isinstance(config, DPESConfig):
        raise ConfigError(
            f"config: expected a DPESConfig or None, got {type(config).__name__}; give the settings "
            "as keywords instead (epsilon=4.0, generations=6, ...)"
        )
    try:
        if config is None:
            return DPESConfig(**settings)
        return DPESConfig(**{**config.model_dump(), **settings}) if settings else config.model_copy()
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc)) from None


def share_below_half(value: float, name: str, why: str) -> float:
    """A share of epsilon spent beside the search: in (0, 0.5), the search keeping most of the budget."""
    if not math.isfinite(value) or not 0 < value < 0.5:
        raise ValueError(f"{name} must be in (0, 0.5), got {value}; {why}")
    return value


class LabellingConfig(BaseModel):
    """The labelling phase (``dp.labelling``): DP labels for a task's public unlabelled inputs by a
    noisy vote of teachers, each teacher the task's prompt with a few records of its own disjoint
    group of the private data (``docs/privacy.md``, "Demonstrations from private labels").

    It spends ``epsilon_share`` of the budget (calibrated alone at the run's delta); the search is
    calibrated to the rest, the two composed by the run's accountant (one stage, one ledger).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    teachers: int | None = Field(
        None,
        ge=2,
        le=10_000,
        description="number of teachers (disjoint groups of the private records); default from the "
        "public N: N / 20, between 10 and 100",
    )
    queries: int | None = Field(
        None,
        ge=1,
        le=10_000,
        description="public inputs to label (the first ones of the task's public_inputs); default "
        f"min({DEFAULT_LABELLING_QUERIES}, the number of public inputs)",
    )
    epsilon_share: float = Field(
        DEFAULT_LABELLING_SHARE,
        description="share of epsilon the labelling is calibrated to (0 < share < 1); the search gets the rest",
    )
    threshold: float | None = Field(
        None, description="confident GNMax: answer only where the noisy top vote count reaches this (teachers)"
    )
    threshold_sigma: float | None = Field(
        None, gt=0, description="confident GNMax: the noise of the threshold step (in votes); with threshold"
    )
    max_demos: int | None = Field(
        None,
        ge=1,
        le=64,
        description=f"demonstrations of its own group in a teacher's prompt; default {DEFAULT_TEACHER_DEMOS} "
        f"(classification) or {DEFAULT_ANSWER_DEMOS} (generation: more teachers from the same records)",
    )
    # -- generation tasks: DP answers voted token by token (dp_textgrad.privacy.token_voting) --------
    max_answer_tokens: int | None = Field(
        None,
        ge=1,
        le=512,
        description="generation tasks: the public cap on a DP answer's tokens (every step up to it is charged); "
        f"default the task's max_new_tokens, at most {DEFAULT_MAX_ANSWER_TOKENS}",
    )
    candidates: int = Field(
        16, ge=1, le=256, description="generation tasks: the public model's most likely next tokens a step votes over"
    )
    copy_input: bool = Field(
        True, description="generation tasks: the public input's own tokens are candidates too (extraction)"
    )
    sampling_rate: float | None = Field(
        None,
        gt=0,
        le=1,
        description="generation tasks: each answer's teachers split a fresh Poisson subsample of the private "
        "records at this rate (amplification by subsampling); default min(1, teachers x max_demos / N)",
    )
    synthetic_inputs: int | None = Field(
        None,
        ge=1,
        le=1000,
        description="generation tasks without public inputs: how many demonstrations to generate whole, input "
        "then answer, by the same token vote (its input's tokens are charged too)",
    )
    max_input_tokens: int = Field(
        48, ge=1, le=512, description="synthetic_inputs: the public cap on a generated input's tokens"
    )
    vote: Literal["token", "span"] = Field(
        "token",
        description="generation tasks: 'token' votes each answer token by token (any task); 'span' (extraction) "
        "lets each teacher write its whole answer and votes once per answer over the public input's spans of at "
        "most max_answer_tokens tokens: one charged step per answer instead of max_answer_tokens",
    )
    answer_filter: Literal["none", "ended", "span"] = Field(
        "none",
        description="generation tasks: drop released answers by a public rule (no privacy cost): 'ended' keeps "
        "answers that released their end before the token cap, 'span' (extraction) those that also appear "
        "verbatim in their input",
    )

    @field_validator("epsilon_share")
    @classmethod
    def _share_in_unit_interval(cls, value: float) -> float:
        if not math.isfinite(value) or not 0 < value < 1:
            raise ValueError(f"epsilon_share must be in (0, 1), got {value}; the search needs the rest of the budget")
        return value

    @model_validator(mode="after")
    def _threshold_pair(self) -> LabellingConfig:
        if (self.threshold is None) != (self.threshold_sigma is None):
            raise ValueError(
                "threshold, threshold_sigma: give both (confident GNMax: answer only where the teachers agree) "
                "or neither (GNMax: every input gets a label)"
            )
        if self.threshold is not None and not math.isfinite(self.threshold):
            raise ValueError(f"threshold must be a finite number of votes, got {self.threshold}")
        return self

    @property
    def answers(self) -> bool:
        """Whether the phase answers a generation task (token votes) rather than labelling."""
        return self.max_answer_tokens is not None

    @property
    def answer_steps(self) -> int | None:
        """Vote steps charged per demonstration: one for a span vote; else the answer's tokens, plus
        the input's when generated."""
        if self.max_answer_tokens is None:
            return None
        if self.vote == "span":
            return 1
        return self.max_answer_tokens + (self.max_input_tokens if self.synthetic_inputs is not None else 0)

    def resolved(
        self, public_inputs: int, dataset_size: int, *, generation_tokens: int | None = None
    ) -> LabellingConfig:
        """A copy with ``queries`` and ``teachers`` filled in from public values: the number of
        public inputs and the public N (declared, or the DP count). ``generation_tokens``: the
        task's ``max_new_tokens`` for a generation task (None: a classification task); it fills
        ``max_answer_tokens`` and ``sampling_rate``."""
        # Non-default values, not model_fields_set: a configuration dumped and read back sets every field.
        generation_only = [
            name
            for name in (
                "max_answer_tokens",
                "candidates",
                "copy_input",
                "sampling_rate",
                "synthetic_inputs",
                "max_input_tokens",
                "answer_filter",
                "vote",
            )
            if getattr(self, name) != type(self).model_fields[name].default
        ]
        if generation_tokens is None and generation_only:
            raise ValueError(
                f"dp.labelling.{generation_only[0]}: applies to generation tasks (DP answers), and this task "
                "classifies; remove it"
            )
        if generation_tokens is not None and (self.threshold is not None or self.threshold_sigma is not None):
            raise ValueError(
                "dp.labelling.threshold: confident GNMax labels classification tasks; a generation task's answers "
                "are voted token by token (remove threshold and threshold_sigma)"
            )
        if self.vote == "span":
            token_only = [
                name
                for name in ("candidates", "copy_input", "synthetic_inputs")
                if getattr(self, name) != type(self).model_fields[name].default
            ]
            if token_only:
                raise ValueError(
                    f"dp.labelling.{token_only[0]}: applies to the token vote; a span vote's candidates are the "
                    "public input's spans (remove it, or use vote: token)"
                )
        if self.synthetic_inputs is not None:
            if self.queries is not None and self.queries != self.synthetic_inputs:
                raise ValueError(
                    "dp.labelling.queries: synthetic_inputs sets how many demonstrations are generated; remove queries"
                )
            if public_inputs:
                raise ValueError(
                    "dp.labelling.synthetic_inputs: the task has public inputs, which give better demonstrations "
                    "than generated ones; remove synthetic_inputs (or the public inputs)"
                )
        elif public_inputs < 1:
            raise ValueError(
                "task.public_inputs: dp.labelling needs public unlabelled inputs to label; give a file of "
                "them (task.public_inputs) or remove dp.labelling"
                + (" (a generation task may generate them: dp.labelling.synthetic_inputs)" if generation_tokens else "")
            )
        if self.synthetic_inputs is not None:
            queries = self.synthetic_inputs
        else:
            queries = min(DEFAULT_LABELLING_QUERIES, public_inputs) if self.queries is None else self.queries
        if self.synthetic_inputs is None and queries > public_inputs:
            raise ValueError(
                f"dp.labelling.queries: {queries} inputs to label, but the task has {public_inputs} public "
                "inputs; lower queries or add public inputs"
            )
        teachers = default_teachers(dataset_size) if self.teachers is None else self.teachers
        demos = self.max_demos
        if demos is None:
            demos = DEFAULT_TEACHER_DEMOS if generation_tokens is None else DEFAULT_ANSWER_DEMOS
        update: dict[str, Any] = {"queries": queries, "teachers": teachers, "max_demos": demos}
        if generation_tokens is not None:
            if self.max_answer_tokens is None:
                update["max_answer_tokens"] = max(1, min(int(generation_tokens), DEFAULT_MAX_ANSWER_TOKENS))
            if self.sampling_rate is None:
                update["sampling_rate"] = default_answer_sampling_rate(teachers, demos, dataset_size)
        return self.model_copy(update=update)


def default_answer_sampling_rate(teachers: int, max_demos: int, dataset_size: int) -> float:
    """The default subsampling rate of a DP answer: enough records for every teacher to show
    ``max_demos`` on average (q N = teachers x max_demos), at most 1. Fewer records per answer buy
    amplification by subsampling: a smaller noise for the same epsilon."""
    return float(min(1.0, teachers * max_demos / max(1, dataset_size)))


def default_teachers(dataset_size: int) -> int:
    """The default number of teachers for a public N: about 20 records each, 10 to 100 teachers.

    More teachers make the vote more robust to noise (a margin of more votes), fewer give each
    teacher more records to show; on SST-2 (2,000 records) 100 teachers of 20 labelled best
    (docs/benchmarks.md, "Teacher votes"). Teachers change no event: only the labels' quality.
    """
    return int(min(100, max(10, dataset_size // 20)))


DEFAULT_FINAL_ESTIMATE_SHARE = 0.2


class FinalEstimateConfig(BaseModel):
    """A fresh DP estimate of the released prompt's score (``dp.final_estimate``), charged after the
    final release: Gaussian noise on the prompt's clipped score sum over a fresh Poisson subsample.

    The search's estimates are biased upward (the released prompt won a best-of-K on noisy scores:
    the winner's curse); this one is not, because neither its subsample nor its noise took part in
    choosing the prompt. It spends ``epsilon_share`` of the budget (calibrated alone at the run's
    delta); the search is calibrated to the rest, as with ``dp.labelling``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    epsilon_share: float = Field(
        DEFAULT_FINAL_ESTIMATE_SHARE,
        description="share of epsilon spent on the estimate (0 < share < 0.5); the search gets the rest",
    )
    sampling_rate: float | None = Field(
        None,
        description="Poisson rate of the estimate's fresh subsample; default min(1, K q): the records of one "
        "generation, all on the released prompt",
    )

    @field_validator("epsilon_share")
    @classmethod
    def _share_below_half(cls, value: float) -> float:
        return share_below_half(
            value, "epsilon_share", "the estimate is a check on the search, which needs most of the budget"
        )

    @field_validator("sampling_rate")
    @classmethod
    def _rate_in_unit_interval(cls, value: float | None) -> float | None:
        if value is not None and (not math.isfinite(value) or not 0 < value <= 1):
            raise ValueError(f"sampling_rate must be in (0, 1], got {value}, or left out (min(1, K q))")
        return value


class DPESConfig(BaseModel):
    """Everything that defines a DP-ES run. Budget first: the noise is calibrated from it.

    N, the private set's size, is private under add/remove neighbours. Either its owner
    declares a public ``dataset_size``, or a run spends ``size_epsilon_share`` of epsilon on
    a DP count first and keeps it in ``counted_dataset_size``; the real count is used for
    nothing released. ``delta`` defaults to min(1e-5, 1 / (10 N)) for a declared N and to
    1e-5 otherwise; ``sampling_rate`` defaults to min(1, 150 / N) with N the declared size
    or the DP count (about 150 records per generation); ``sampling_rate: auto`` plans q from the
    budget and schedule (``dp_es.plan.resolve_sampling_rate``), within ``max_private_evaluations``.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    epsilon: float = Field(4.0, description="total privacy budget epsilon for the whole run")
    delta: float | None = Field(
        None, description="total delta; default min(1e-5, 1/(10 N)) for a declared N, else 1e-5"
    )
    generations: int = Field(6, ge=1, le=10_000, description="number of DP generations T")
    population: int = Field(6, ge=2, le=256, description="candidates scored per generation K")
    parents: int = Field(2, ge=1, description="parents kept per generation k")
    elites: int = Field(1, ge=0, description="best candidates carried to the next generation unchanged")
    sampling_rate: float | Literal["auto"] | None = Field(
        None,
        description="Poisson sampling rate q in (0, 1]; 'auto': the q (and noise) that give each candidate's "
        "mean score the least noise for the budget and schedule, within max_private_evaluations; default "
        "min(1, 150 / N)",
    )
    max_private_evaluations: int | None = Field(
        None,
        ge=1,
        description="public cap on the planned private record evaluations of the search, q N K T (what "
        f"sampling_rate 'auto' may spend); default for auto: {AUTO_RECORDS_PER_GENERATION} x K x T",
    )
    selection: SelectionKind = Field(
        "gaussian",
        description="gaussian: noisy scores, top-k of the estimates (free); exponential: Gumbel "
        "top-k; permute_and_flip: k permute-and-flip picks (both release indices only)",
    )
    final_selection: FinalSelection = Field(
        "last", description="'last': free; 'exponential' or 'permute_and_flip': charged, on a fresh subsample"
    )
    final_epsilon: float = Field(0.5, gt=0, description="epsilon0 of the charged final selection")
    final_estimate: FinalEstimateConfig | None = Field(
        None,
        description="a fresh DP estimate of the released prompt's score, free of the winner's curse, for "
        "epsilon_share of the budget (true: the defaults; default: none)",
    )
    feedback: FeedbackKind = Field(
        "dp_confusion",
        description="DP aggregate feedback for critiques: the confusion matrix (classification) or the "
        "failure histogram (generation), released on the scoring subsample",
    )
    feedback_noise_ratio: float = Field(3.0, gt=0, description="feedback noise multiplier / score noise multiplier")
    mode: FeedbackMode = Field("public", description="'unsafe' lets raw private examples reach the mutator")
    unsafe_examples: int = Field(
        8, ge=1, description="raw private records (at most N) shown to the mutator; used only in mode='unsafe'"
    )
    privacy: PrivacyKind = Field(
        "dp", description="'off': NON-PRIVATE baseline (exact scores, no noise, no budget; ledger says so)"
    )
    shrinkage: bool = Field(True, description="rank candidates by empirical-Bayes shrunk estimates (free)")
    use_critiques: bool = Field(True, description="ask the LLM for critiques of the parents before rewriting")
    llm_operators: bool | None = Field(
        None,
        description="LLM rewrites and critiques; default: on when the engine follows instructions "
        "(off for the default base model, which continues patterns instead)",
    )
    seed: int = Field(0, description="seed of non-private choices (mutations); never of DP noise")
    insecure_noise_seed: int | None = Field(
        None, description="INSECURE: reproducible DP noise and subsampling, for tests and research only"
    )
    max_prompt_chars: int = Field(1500, ge=50, description="longest candidate prompt kept")
    dataset_size: int | None = Field(
        None,
        ge=1,
        description="the public size N of the private set, declared by its owner (the denominator "
        "q*N of every estimate and the base of the default delta and q); default: not "
        "declared, then a DP count of N (size_epsilon_share of epsilon) stands for it",
    )
    size_epsilon_share: float = Field(
        0.05,
        description="share of epsilon spent on the DP count of N when dataset_size is not declared "
        "(0 < share < 0.5); the search is calibrated to the rest",
    )
    counted_dataset_size: int | None = Field(
        None,
        ge=1,
        description="the DP count of N this run released (set by the run and kept on resume; to give "
        "a public N, set dataset_size instead)",
    )
    max_record_tokens: int = Field(
        256,
        ge=8,
        le=1_000_000,
        description="public cap on a private record's length in engine tokens, applied before any charge",
    )
    long_records: LongRecords = Field(
        "truncate",
        description="private records over max_record_tokens: 'truncate' them (a per-record, "
        "data-independent map) or 'reject' the data before anything is charged",
    )

    max_error_share: float | None = Field(
        None,
        description="stop the run when the noisy share of sampled private records whose scoring failed "
        "(engine or pipeline errors; each scored 0) is above this share by two noise standard deviations: "
        "a DP decision, released with the scores (their noise multiplier grows by about 5% at the same "
        "epsilon); default: failures never stop a run",
    )
    labelling: LabellingConfig | None = Field(
        None,
        description="DP labels for the task's public unlabelled inputs by a noisy teacher vote, spent "
        "before the search; the labelled inputs become public demonstrations (default: off)",
    )
    warmup_generations: int = Field(
        0,
        ge=0,
        le=100,
        description="a non-private search on the public labelled examples alone (no private record is "
        "read, nothing is charged) before the DP phase; its best prompts join generation 0",
    )

    @field_validator("epsilon")
    @classmethod
    def _finite_positive_epsilon(cls, value: float) -> float:
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"epsilon must be a finite number > 0, got {value}")
        return value

    @field_validator("delta")
    @classmethod
    def _delta_in_unit_interval(cls, value: float | None) -> float | None:
        if value is not None and (not math.isfinite(value) or not 0 < value < 1):
            raise ValueError(f"delta must be in (0, 1), got {value}")
        return value

    @field_validator("size_epsilon_share")
    @classmethod
    def _share_below_half(cls, value: float) -> float:
        return share_below_half(
            value,
            "size_epsilon_share",
            "the search needs most of the budget (or declare dataset_size and spend nothing on N)",
        )

    @field_validator("max_error_share")
    @classmethod
    def _error_share_in_unit_interval(cls, value: float | None) -> float | None:
        if value is not None and (not math.isfinite(value) or not 0 < value < 1):
            raise ValueError(f"max_error_share must be in (0, 1), got {value}, or left out (never stop on failures)")
        return value

    @field_validator("final_estimate", mode="before")
    @classmethod
    def _estimate_shorthand(cls, value: Any) -> Any:
        if isinstance(value, bool):  # `final_estimate: true` in a run file: the defaults
            return FinalEstimateConfig() if value else None
        return value

    @field_validator("sampling_rate", mode="before")
    @classmethod
    def _rate_or_auto(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().lower() != "auto":
            try:
                return float(value)
            except ValueError:
                raise ValueError(f"sampling_rate must be a number in (0, 1] or 'auto', got {value!r}") from None
        return "auto" if isinstance(value, str) else value

    @field_validator("sampling_rate")
    @classmethod
    def _rate_in_unit_interval(cls, value: float | str | None) -> float | str | None:
        if isinstance(value, str):
            return value  # "auto": planned by dp_es.plan.resolve_sampling_rate once N is known
        if value is not None and (not math.isfinite(value) or not 0 < value <= 1):
            raise ValueError(f"sampling_rate must be in (0, 1] or 'auto', got {value}")
        return value

    @model_validator(mode="after")
    def _consistent_schedule(self) -> DPESConfig:
        if self.dataset_size is not None and self.counted_dataset_size is not None:
            raise ValueError(
                "counted_dataset_size: a run sets it when N is not declared; with dataset_size "
                "declared remove counted_dataset_size"
            )
        if self.parents > self.population:
            raise ValueError(
                f"parents ({self.parents}) must not exceed population ({self.population}): "
                "raise population or lower parents"
            )
        if self.elites > self.parents:
            raise ValueError(f"elites ({self.elites}) must not exceed parents ({self.parents})")
        from dp_textgrad.dp_es.selector import SELECTION_STRATEGIES  # the registry says what each supports

        strategy = SELECTION_STRATEGIES[self.selection]
        if self.privacy == "off" and not strategy.releases_scores:
            raise ValueError("privacy: 'off' ranks candidates by exact scores; set selection='gaussian'")
        if self.privacy == "off" and self.labelling is not None:
            raise ValueError(
                "labelling: the teacher vote is a DP mechanism and privacy 'off' has none; remove dp.labelling "
                "(give public labelled examples to a non-private baseline instead)"
            )
        if self.privacy == "off" and self.final_selection != "last":
            raise ValueError("privacy: 'off' has no DP final selection; set final_selection='last'")
        if self.privacy == "off" and self.final_estimate is not None:
            raise ValueError(
                "final_estimate: a DP re-estimate needs privacy 'dp'; privacy 'off' reports exact scores (remove "
                "final_estimate, or score the prompt on test data with `dp-textgrad evaluate`)"
            )
        if self.max_error_share is not None and not strategy.releases_scores:
            raise ValueError(
                f"max_error_share: the count of failed records is released with the Gaussian scores; with "
                f"selection='{self.selection}' remove max_error_share (failures then never stop the run)"
            )
        if self.feedback != "none" and not strategy.supports_feedback:
            raise ValueError(
                f"feedback: DP feedback shares the Gaussian scoring subsample; with "
                f"selection='{self.selection}' set feedback='none'"
            )
        return self

    # -- the dataset size ---------------------------------------------------------------
    @property
    def counts_dataset_size(self) -> bool:
        """Whether a run spends ``size_epsilon_share`` of epsilon on a DP count of N first."""
        return self.dataset_size is None and self.privacy == "dp"

    @property
    def size_epsilon(self) -> float:
        """Epsilon of the DP count of N (stage 1); 0 when N is declared (or privacy is off)."""
        return self.size_epsilon_share * self.epsilon if self.counts_dataset_size else 0.0

    @property
    def search_epsilon(self) -> float:
        """Epsilon the search is calibrated to (stage 2): the budget less the count's."""
        return self.epsilon - self.size_epsilon

    @property
    def public_dataset_size(self) -> int | None:
        """N as released: the declared size, else the DP count (None before the count)."""
        return self.dataset_size if self.dataset_size is not None else self.counted_dataset_size

    @property
    def resolved_delta(self) -> float:
        """delta of a resolved config (:meth:`resolved` fills the default)."""
        if self.delta is None:
            raise ConfigError("delta: not resolved yet (DPESConfig.resolved fills it from the dataset size)")
        return self.delta

    @property
    def resolved_sampling_rate(self) -> float:
        """The Poisson sampling rate q of a resolved config (:meth:`resolved` fills the default)."""
        if self.sampling_rate is None:
            raise ConfigError("sampling_rate: not resolved yet (DPESConfig.resolved fills it from the dataset size)")
        if self.sampling_rate == "auto":
            raise ConfigError("sampling_rate: 'auto' is not planned yet (dp_es.plan.resolve_sampling_rate plans it)")
        return float(self.sampling_rate)

    @property
    def final_estimate_rate(self) -> float | None:
        """The Poisson rate of the final estimate's fresh subsample (None: no final estimate)."""
        if self.final_estimate is None:
            return None
        if self.final_estimate.sampling_rate is not None:
            return float(self.final_estimate.sampling_rate)
        return min(1.0, self.population * self.resolved_sampling_rate)

    @property
    def auto_sampling_rate(self) -> bool:
        """Whether q is planned (``sampling_rate: auto``) rather than given."""
        return self.sampling_rate == "auto"

    @property
    def evaluation_cap(self) -> int:
        """The public cap on planned private record evaluations (q N K T) that ``auto`` plans within."""
        if self.max_private_evaluations is not None:
            return int(self.max_private_evaluations)
        return AUTO_RECORDS_PER_GENERATION * self.population * self.generations

    def resolved(self, dataset_size: int | None = None) -> DPESConfig:
        """A copy with the size-dependent defaults (delta, sampling rate) filled in.

        N is the declared ``dataset_size``, else the DP count ``counted_dataset_size``.
        ``dataset_size`` here declares N public for a configuration that has neither
        (planning tools, benchmarks, the non-private baseline); a private run never passes
        its record count (``DPEvolutionStrategy`` counts it with DP instead).
        """
        update: dict[str, float] = {}
        size = self.public_dataset_size
        if size is None:
            if dataset_size is None:
                raise ValueError(
                    "dataset_size: no N to plan with; declare dataset_size (a public N) or let the "
                    "run count it (DPEvolutionStrategy does)"
                )
            if dataset_size < 1:
                raise ValueError("private_train: the private dataset is empty; give at least one record")
            size = update["dataset_size"] = int(dataset_size)
        declared = self.dataset_size is not None or "dataset_size" in update
        if self.delta is None:
            # A declared N may set the default; a counted one must not (delta is fixed before the count).
            delta = update["delta"] = min(DEFAULT_DELTA, 1.0 / (10 * size)) if declared else DEFAULT_DELTA
        else:
            delta = self.delta
        if delta >= 1.0 / size:
            source = "" if declared else " (N here is the DP count)"
            warnings.warn(
                f"delta: {delta:g} >= 1/N = {1.0 / size:g}{source} permits releasing a record outright; "
                f"use delta <= {1.0 / (10 * size):.1e}",
                stacklevel=2,
            )
        if self.sampling_rate is None:
            update["sampling_rate"] = min(1.0, DEFAULT_EXPECTED_BATCH / size)
        return self.model_copy(update=update)
