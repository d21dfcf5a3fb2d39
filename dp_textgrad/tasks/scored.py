"""Tasks scored by the caller's own function: how a DSPy program, a GEPA adapter or any pipeline
plugs into DP-ES.

A :class:`ScoredTask` knows nothing of how a prompt meets a record: ``score_record(prompt,
record)`` runs the caller's pipeline on ONE record with the candidate prompt and returns its
score in [0, 1] (or ``(score, category)``). The task clips the score to [0, C] and puts each
record in one public failure category, so one record still moves a score sum by at most C and
adds exactly one unit to the failure histogram, whatever the pipeline does.

Rules the pipeline must keep (the integrations keep them; a custom pipeline must too): a call
sees one record and public text only (the prompt, public demonstrations, public settings); it
writes nothing computed from the record anywhere (no disk cache, no history, no callbacks, no
logging). A malformed output or a failing metric is a score of 0 in the ``unparsed`` category,
decided inside ``score_record``; a ``score_record`` that raises on a record (its program, its
engine, a server that is down) scores 0 in the public ``error`` category, the same rule for every
record: a failure on one private record never stops the run (docs/privacy.md, "Failures on
private records").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from dp_textgrad.privacy.data import PrivateBatch, PrivateDataset
from dp_textgrad.tasks.base import ERROR_CATEGORY, ERROR_DESCRIPTION, Example, FeedbackSpec
from dp_textgrad.tasks.components import PromptComponent, join_components, split_components

T = TypeVar("T")

if TYPE_CHECKING:
    from dp_textgrad.engines.base import Engine

#: The public failure categories of a scored task (name -> one-line description).
SCORED_CATEGORIES: dict[str, str] = {
    "correct": "the output got full marks",
    "partial": "the output got part of the marks",
    "wrong": "the output got no marks",
    "unparsed": "the output could not be parsed, or the metric failed on it",
    ERROR_CATEGORY: ERROR_DESCRIPTION,
}

#: What ``score_record`` returns: a score in [0, 1], or a score and a category name.
RecordScore = float | tuple[float, str]


@dataclass(frozen=True)
class ScoredExample(Example):
    """A public example of a scored task: ``payload`` is the caller's own record (a
    ``dspy.Example``, a GEPA data instance); ``text`` its public rendering as a demonstration."""

    label: str = ""
    payload: Any = None


@dataclass(frozen=True)
class ScoredOutcomes:
    """What one candidate did on a batch of records (private until noised): clipped scores in
    [0, C], each record's category index in ``SCORED_CATEGORIES`` order, which records' pipeline
    raised (``failed``) and the first such error's text (``error_detail``, operator-only)."""

    scores: np.ndarray
    categories: np.ndarray
    failed: np.ndarray | None = None
    error_detail: str | None = None


def category_of(value: Any, categories: Sequence[str]) -> tuple[float, int]:
    """A score (or ``(score, category)``) as a clipped score in [0, 1] and a category index.

    The same rule for every record: a non-number or NaN is 0, unparsed; a named category that
    is not one of ``categories`` falls back to the score's own category."""
    named: str | None = None
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], str):
        value, named = value
    try:
        score = float(value)
    except (TypeError, ValueError):
        score = math.nan
    if not math.isfinite(score):
        return 0.0, list(categories).index("unparsed") if "unparsed" in categories else len(categories) - 1
    score = min(max(score, 0.0), 1.0)
    if named is not None and named in categories:
        return score, list(categories).index(named)
    default = "correct" if score >= 1.0 else "wrong" if score <= 0.0 else "partial"
    return score, list(categories).index(default) if default in categories else len(categories) - 1


@dataclass
class ScoredTask:
    """A task whose per-record score comes from ``score_record(prompt, record)`` (module docstring).

    ``render_example`` turns a public example's payload into demonstration text (the demo
    operators put it into candidate prompts); ``threads`` records are scored at once, each call
    on its own record; ``probe(prompt)`` is a public check run by the preflight before anything is
    charged (e.g. one call on a public example), raising on a pipeline that cannot run;
    ``deterministic``: the score is a fixed function of prompt and record (greedy decoding, no
    sampling), so an interrupted charge can be replayed on a resume instead of charged again.
    ``components``: the parts of a multi-part prompt (:mod:`dp_textgrad.tasks.components`); the
    prompts ``score_record`` gets, ``seed_prompt`` included, are then their joined text.
    ``score_record_many(prompts, record)``: optional, ONE record under several prompts at once
    (a result or the exception raised per prompt, in order), for a pipeline that batches the
    prompts' work on one record; DP-ES then scores record by record, never two records together.
    """

    name: str
    description: str
    private_train: PrivateDataset[Any]
    test: list[Any]
    score_record: Callable[[str, Any], RecordScore]
    public_examples: list[ScoredExample] = field(default_factory=list)
    render_example: Callable[[Any], str] | None = None
    categories: Mapping[str, str] = field(default_factory=lambda: dict(SCORED_CATEGORIES))
    metric: str = "score"
    binary: bool = False
    clip_bound: float = 1.0
    seed_prompt: str = ""
    threads: int = 1
    probe: Callable[[str], None] | None = None
    deterministic: bool = False
    components: tuple[PromptComponent, ...] = ()
    # DP demonstrations (dp.labelling): the teachers' view of the task (a GenerationTask whose
    # public inputs they answer), and how the released answers join this task's demonstrations.
    answering: Any = None
    with_answers: Callable[[ScoredTask, Sequence[Any]], ScoredTask] | None = None
    score_record_many: Callable[[Sequence[str], Any], Sequence[RecordScore | BaseException]] | None = None

    kind = "generate"

    def __post_init__(self) -> None:
        if not callable(self.score_record):
            raise TypeError("score_record: must be a callable (prompt, record) -> score in [0, 1]")
        if self.score_record_many is not None and not callable(self.score_record_many):
            raise TypeError("score_record_many: must be a callable (prompts, record) -> one score per prompt")
        if not (self.clip_bound > 0 and math.isfinite(self.clip_bound)):
            raise ValueError("clip_bound: must be > 0")
        if isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads < 1:
            raise ValueError(f"threads: must be an int >= 1, got {self.threads!r}")
        if not self.categories:
            raise ValueError("categories: a scored task needs at least one public failure category")
        if not isinstance(self.private_train, PrivateDataset):
            raise TypeError("private_train: wrap the private records in dp_textgrad.privacy.data.PrivateDataset")
        for position, example in enumerate(self.public_examples):
            if not isinstance(example, ScoredExample):
                raise TypeError(f"public_examples[{position}]: expected a ScoredExample")
        self.components = tuple(self.components)
        if self.components:
            names = [part.name for part in self.components]
            if len(set(names)) != len(names):
                raise ValueError(f"components: names must differ, got {', '.join(names)}")
            if not self.seed_prompt:
                self.seed_prompt = join_components({part.name: part.seed for part in self.components}, names)
            split_components(self.seed_prompt, names)  # raises unless the seed holds every part

    # -- the protocol's public descriptions ---------------------------------------------
    @property
    def labels(self) -> list[str]:
        return []

    @property
    def public_inputs(self) -> list[str]:
        """The public inputs the teachers of a labelling phase answer (none without ``answering``)."""
        return list(getattr(self.answering, "public_inputs", []))

    @property
    def metric_name(self) -> str:
        return self.metric

    @property
    def binary_scores(self) -> bool:
        return self.binary

    @property
    def feedback(self) -> FeedbackSpec:
        names = tuple(self.categories)
        return FeedbackSpec("failures", names, tuple(self.categories[n] for n in names))

    def with_bounded_records(
        self,
        count_tokens: Callable[[str], int],
        truncate: Callable[[str, int], str],
        max_tokens: int,
        policy: str = "truncate",
    ) -> ScoredTask:
        """Unchanged: the pipeline, not this task, decides how a record becomes model input
        (a record too long for the model fails inside its own call, the same rule for all)."""
        if policy not in ("truncate", "reject"):
            raise ValueError(f"long_records: use 'truncate' or 'reject', got {policy!r}")
        return self

    # -- rendering (the prompt is the pipeline's instruction; demos are text in it) ----------
    def render_prefix(self, prompt: str) -> str:
        return prompt.rstrip() + "\n\n" if prompt.strip() else ""

    def render_record(self, text: str) -> str:
        return text

    def render_demo(self, example: Example) -> str:
        payload = getattr(example, "payload", None)
        if self.render_example is not None and payload is not None:
            return str(self.render_example(payload))
        return example.text

    # -- scoring ----------------------------------------------------------------------
    def _result(self, found: RecordScore | BaseException) -> tuple[float, int, str | None]:
        """A record's (score, category, failure text or None) from what its pipeline gave."""
        names = list(self.categories)
        if isinstance(found, BaseException):  # a failure on a record is data: 0, category error
            if not isinstance(found, Exception):
                raise found  # KeyboardInterrupt, SystemExit: not the record's doing
            error = names.index(ERROR_CATEGORY) if ERROR_CATEGORY in names else len(names) - 1
            return 0.0, error, f"{type(found).__name__}: {found}"
        return (*category_of(found, names), None)

    def _per_record(self, records: Sequence[Any], one: Callable[[Any], T]) -> list[T]:
        """``one(record)`` for each record, ``threads`` records at once."""
        if self.threads > 1 and len(records) > 1:
            with ThreadPoolExecutor(max_workers=min(self.threads, len(records))) as pool:
                return list(pool.map(one, records))
        return [one(r) for r in records]

    def _outcomes(self, prompt: str, records: Sequence[Any]) -> ScoredOutcomes:
        def one(record: Any) -> tuple[float, int, str | None]:
            try:
                found: RecordScore | BaseException = self.score_record(prompt, record)
            except Exception as exc:  # noqa: BLE001 - a failure on a record is data (_result)
                found = exc
            return self._result(found)

        return self._stacked(self._per_record(records, one))

    def _outcomes_many(self, prompts: Sequence[str], records: Sequence[Any]) -> list[ScoredOutcomes]:
        many = self.score_record_many
        assert many is not None

        def one(record: Any) -> list[tuple[float, int, str | None]]:
            try:
                found = list(many(prompts, record))
                if len(found) != len(prompts):
                    raise RuntimeError("score_record_many: returned the wrong number of scores")
            except Exception as exc:  # noqa: BLE001 - the record failed under every prompt
                found = [exc] * len(prompts)
            return [self._result(result) for result in found]

        per_record = self._per_record(records, one)
        return [self._stacked([row[k] for row in per_record]) for k in range(len(prompts))]

    def _stacked(self, results: Sequence[tuple[float, int, str | None]]) -> ScoredOutcomes:
        scores = np.array([s for s, _, _ in results], dtype=float) * self.clip_bound
        categories = np.array([c for _, c, _ in results], dtype=int)
        failed = np.array([d is not None for _, _, d in results], dtype=bool)
        detail = next((d for _, _, d in results if d is not None), None)
        n = len(results)
        return ScoredOutcomes(scores.reshape(n), categories.reshape(n), failed.reshape(n), detail)

    def private_outcomes(self, engine: Engine, prompt: str, batch: PrivateBatch[Any]) -> ScoredOutcomes:
        """Outcomes on private records. Call only from a DP mechanism."""
        return self._outcomes(prompt, [rec.unwrap() for rec in batch])

    def private_outcomes_many(
        self, engine: Engine, prompts: Sequence[str], batch: PrivateBatch[Any]
    ) -> list[ScoredOutcomes]:
        """Outcomes of every prompt on private records, one per prompt: record by record under all
        the prompts at once where the task has ``score_record_many`` (one record per call, so one
        record changes only its own scores), else prompt by prompt. Call only from a DP mechanism."""
        if self.score_record_many is None or len(prompts) < 2:
            return [self.private_outcomes(engine, prompt, batch) for prompt in prompts]
        return self._outcomes_many(list(prompts), [rec.unwrap() for rec in batch])

    def public_outcomes(self, prompt: str, examples: Sequence[Any]) -> ScoredOutcomes:
        """Outcomes on public or test records; a pipeline that raises on one stops with its error
        (public records: the message may quote them)."""
        found = self._outcomes(prompt, [e.payload if isinstance(e, ScoredExample) else e for e in examples])
        if found.failed is not None and found.failed.any():
            raise RuntimeError(f"score_record failed on a public or test example: {found.error_detail}")
        return found

    def feedback_counts(self, outcomes: ScoredOutcomes) -> np.ndarray:
        """The failure histogram of ``outcomes``: each record adds 1 to its category."""
        return np.bincount(np.asarray(outcomes.categories, dtype=int), minlength=len(self.categories)).astype(float)

    def public_scores(self, engine: Engine, prompt: str, examples: Sequence[Any]) -> np.ndarray:
        """Per-record scores in [0, 1] on public or test records (evaluation, no privacy)."""
        return np.asarray(self.public_outcomes(prompt, examples).scores, dtype=float) / self.clip_bound

    def mean_score(self, engine: Engine, prompt: str, examples: Sequence[Any] | None = None) -> float:
        """Mean score of ``prompt`` on the test split (research evaluation; not covered by DP)."""
        examples = self.test if examples is None else examples
        if not examples:
            raise ValueError("test: no examples to evaluate on")
        return float(np.mean(self.public_scores(engine, prompt, examples)))


__all__ = ["SCORED_CATEGORIES", "RecordScore", "ScoredExample", "ScoredOutcomes", "ScoredTask", "category_of"]
