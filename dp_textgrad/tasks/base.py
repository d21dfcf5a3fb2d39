"""Tasks: private records, public records, a test split, and how a prompt meets a record.

Every task follows one protocol (:class:`Task`): it turns (engine, prompt, records) into
per-record scores in [0, C] and, for the DP feedback, into counts to which one record adds
exactly one unit (one cell per feedback candidate, so the L2 sensitivity of m released
vectors is sqrt(m) whatever their shape). The scorer, the planner and the mechanisms see
only that. Two families implement it:

- :class:`ClassificationTask` (here) renders model input as::

      <candidate prompt>\n\n<record_template with the record's text>

  and reads the label by comparing the log-probabilities of each label's verbaliser
  (e.g. " fraud") as the continuation; its feedback is the confusion matrix (gold x predicted).
- ``GenerationTask`` (:mod:`dp_textgrad.tasks.generation`) generates an output after the same
  input and scores it with a metric against a reference; its feedback is a histogram of
  public failure categories.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import numpy as np

from dp_textgrad.privacy.data import PrivateBatch, PrivateDataset

if TYPE_CHECKING:
    from dp_textgrad.engines.base import Engine

ScoreKind = Literal["accuracy", "label_prob"]

#: The public failure category of a record whose engine call or pipeline raised (it scores 0):
#: generation and scored tasks have it in their failure histograms (docs/privacy.md, "Failures
#: on private records").
ERROR_CATEGORY = "error"
ERROR_DESCRIPTION = "the engine or the pipeline failed on this record (scored 0)"


@dataclass(frozen=True)
class Example:
    """One labelled record."""

    text: str
    label: str


@dataclass(frozen=True)
class FeedbackSpec:
    """The public shape of a task's DP feedback (what one record adds one unit to).

    ``kind``: ``confusion`` (classification: an L x L matrix over ``names``, the labels) or
    ``failures`` (generation: a histogram over ``names``, the failure categories, each with
    its one-line public ``descriptions`` entry).
    """

    kind: Literal["confusion", "failures"]
    names: tuple[str, ...]
    descriptions: tuple[str, ...] = ()

    @property
    def shape(self) -> tuple[int, ...]:
        size = len(self.names)
        return (size, size) if self.kind == "confusion" else (size,)


@runtime_checkable
class Task(Protocol):
    """What the search needs from a task (both families implement it).

    ``private_outcomes`` is called only from a DP mechanism; ``feedback_counts`` turns its
    outcomes into counts of shape ``feedback.shape`` to which each record adds exactly one
    unit; ``public_scores`` scores public or test records in [0, 1] (evaluation, no privacy).
    ``metric_name`` names the score in reports; ``binary_scores``: every score is 0 or 1.
    """

    name: str
    description: str
    private_train: PrivateDataset[Any]
    test: list[Any]
    public_examples: list[Any]
    clip_bound: float
    seed_prompt: str

    @property
    def kind(self) -> str: ...

    @property
    def labels(self) -> list[str]: ...

    @property
    def metric_name(self) -> str: ...

    @property
    def binary_scores(self) -> bool: ...

    @property
    def feedback(self) -> FeedbackSpec: ...

    def render_prefix(self, prompt: str) -> str: ...

    def render_record(self, text: str) -> str: ...

    def render_demo(self, example: Any) -> str: ...

    def private_outcomes(self, engine: Engine, prompt: str, batch: PrivateBatch[Any]) -> Any: ...

    def feedback_counts(self, outcomes: Any) -> np.ndarray: ...

    def public_scores(self, engine: Engine, prompt: str, examples: Sequence[Any]) -> np.ndarray: ...

    def mean_score(self, engine: Engine, prompt: str, examples: Sequence[Any] | None = None) -> float: ...

    def with_bounded_records(
        self,
        count_tokens: Callable[[str], int],
        truncate: Callable[[str, int], str],
        max_tokens: int,
        policy: str = "truncate",
    ) -> Task: ...


@dataclass(frozen=True)
class RecordOutcomes:
    """What one candidate did on a batch of records (private until noised).

    ``scores``: per-record score, shape (n,), NOT yet clipped by the caller.
    ``gold`` / ``predicted``: label indices, shape (n,), for DP confusion matrices.
    """

    scores: np.ndarray
    gold: np.ndarray
    predicted: np.ndarray


@dataclass
class ClassificationTask:
    """A text-classification task over private records.

    ``labels`` are the public label names; ``verbalizers`` map each label to the text
    the model should continue with (default: " " + label). ``record_template`` must
    contain ``{text}`` and end where the label word starts. ``public_inputs`` are public
    inputs without labels (a labelling phase gives them DP labels, ``dp.labelling``).
    """

    name: str
    description: str
    labels: list[str]
    private_train: PrivateDataset[Example]
    test: list[Example]
    public_examples: list[Example] = field(default_factory=list)
    verbalizers: dict[str, str] = field(default_factory=dict)
    record_template: str = "Text: {text}\nLabel:"
    score_kind: ScoreKind = "accuracy"
    clip_bound: float = 1.0
    seed_prompt: str = ""
    # Public inputs without labels: what a labelling phase (dp.labelling) gives DP labels to.
    public_inputs: list[str] = field(default_factory=list)

    kind = "classify"

    def __post_init__(self) -> None:
        if not self.labels:
            raise ValueError("labels: a classification task needs at least two labels")
        if len(set(self.labels)) != len(self.labels):
            raise ValueError("labels: label names must be unique")
        if len(self.labels) < 2:
            raise ValueError("labels: a classification task needs at least two labels")
        if "{text}" not in self.record_template:
            raise ValueError("record_template: must contain the placeholder {text}")
        if not self.verbalizers:
            self.verbalizers = {label: " " + label for label in self.labels}
        missing = [label for label in self.labels if label not in self.verbalizers]
        if missing:
            raise ValueError(f"verbalizers: no verbaliser for labels {missing}")
        if self.clip_bound <= 0:
            raise ValueError("clip_bound: must be > 0")
        if self.score_kind not in ("accuracy", "label_prob"):
            raise ValueError("score_kind: use 'accuracy' or 'label_prob'")
        known = set(self.labels)
        for split_name, split in (("test", self.test), ("public_examples", self.public_examples)):
            bad = sorted({ex.label for ex in split if ex.label not in known})
            if bad:
                raise ValueError(f"{split_name}: unknown labels {bad}; known labels are {self.labels}")
        bad_inputs = [i for i, text in enumerate(self.public_inputs) if not isinstance(text, str) or not text.strip()]
        if bad_inputs:
            raise ValueError(
                f"public_inputs: item(s) {bad_inputs[:5]} are not text; every public input must be a non-empty string"
            )
        # Private labels are checked without revealing the records in the message.
        unknown = sum(1 for rec in self.private_train if rec.unwrap().label not in known)
        if unknown:
            raise ValueError(
                f"private_train: {unknown} record(s) have a label outside {self.labels}; "
                "fix the labels or the label list"
            )
        empty = sum(1 for rec in self.private_train if not rec.unwrap().text.strip())
        if empty:
            raise ValueError(f"private_train: {empty} record(s) have empty text; drop them before building the task")
        # No warning about the label mix of private_train: a run that goes on prints nothing
        # computed from private records (docs/privacy.md, the release boundary).

    def with_bounded_records(
        self,
        count_tokens: Callable[[str], int],
        truncate: Callable[[str, int], str],
        max_tokens: int,
        policy: str = "truncate",
    ) -> ClassificationTask:
        """This task with every private record at most ``max_tokens`` long (a public cap).

        Runs before anything is charged. ``truncate`` cuts each record on its own, a
        data-independent map, so DP of the run on the bounded records is DP on the
        originals. ``reject`` stops instead, naming the cap and not the record.
        """
        records = [rec.unwrap() for rec in self.private_train]
        long = [i for i, rec in enumerate(records) if count_tokens(rec.text) > max_tokens]
        if not long:
            return self
        if policy == "reject":
            raise ValueError(
                f"private_train: records of task {self.name!r} exceed dp.max_record_tokens = {max_tokens} engine "
                "tokens; raise dp.max_record_tokens (within the engine's context) or set "
                "dp.long_records = 'truncate'"
            )
        if policy != "truncate":
            raise ValueError(f"long_records: use 'truncate' or 'reject', got {policy!r}")
        for i in long:
            records[i] = Example(truncate(records[i].text, max_tokens), records[i].label)
        return replace(self, private_train=PrivateDataset(records))

    # -- the protocol's public descriptions ---------------------------------------------
    @property
    def metric_name(self) -> str:
        return "accuracy"

    @property
    def binary_scores(self) -> bool:
        return True

    @property
    def feedback(self) -> FeedbackSpec:
        return FeedbackSpec("confusion", tuple(self.labels))

    # -- rendering ------------------------------------------------------------------
    def render_prefix(self, prompt: str) -> str:
        """The shared prefix of every record's model input under ``prompt``."""
        return prompt.rstrip() + "\n\n" if prompt.strip() else ""

    def render_record(self, text: str) -> str:
        return self.record_template.format(text=text)

    def render_demo(self, example: Example, verbalizers: Mapping[str, str] | None = None) -> str:
        """A public example as a few-shot demonstration."""
        verbalizers = verbalizers or self.verbalizers
        return self.render_record(example.text) + verbalizers[example.label]

    # -- scoring --------------------------------------------------------------------
    def _outcomes(
        self,
        engine: Engine,
        prompt: str,
        texts: Sequence[str],
        gold: Sequence[str],
        verbalizers: Mapping[str, str] | None = None,
    ) -> RecordOutcomes:
        verbalizers = verbalizers or self.verbalizers
        choices = [verbalizers[label] for label in self.labels]
        gold_idx = np.array([self.labels.index(g) for g in gold], dtype=int)
        if not texts:
            empty = np.zeros(0)
            return RecordOutcomes(empty, gold_idx, np.zeros(0, dtype=int))
        logprobs = np.asarray(
            engine.score_choices_batch(self.render_prefix(prompt), [self.render_record(t) for t in texts], choices),
            dtype=float,
        )
        predicted = logprobs.argmax(axis=1)
        if self.score_kind == "accuracy":
            scores = (predicted == gold_idx).astype(float) * self.clip_bound
        else:  # probability of the gold label, normalised over the label set
            shifted = logprobs - logprobs.max(axis=1, keepdims=True)
            probs = np.exp(shifted) / np.exp(shifted).sum(axis=1, keepdims=True)
            scores = probs[np.arange(len(texts)), gold_idx] * self.clip_bound
        return RecordOutcomes(scores=scores, gold=gold_idx, predicted=predicted)

    def private_outcomes(
        self, engine: Engine, prompt: str, batch: PrivateBatch[Example], verbalizers: Mapping[str, str] | None = None
    ) -> RecordOutcomes:
        """Outcomes on private records. Call only from a DP mechanism."""
        records = [rec.unwrap() for rec in batch]
        return self._outcomes(engine, prompt, [r.text for r in records], [r.label for r in records], verbalizers)

    def public_outcomes(
        self, engine: Engine, prompt: str, examples: Sequence[Example], verbalizers: Mapping[str, str] | None = None
    ) -> RecordOutcomes:
        """Outcomes on public or test records (no privacy involved)."""
        return self._outcomes(engine, prompt, [e.text for e in examples], [e.label for e in examples], verbalizers)

    def feedback_counts(self, outcomes: RecordOutcomes) -> np.ndarray:
        """The confusion matrix of ``outcomes``: each record adds 1 to cell (gold, predicted)."""
        counts = np.zeros((len(self.labels), len(self.labels)), dtype=float)
        np.add.at(counts, (np.asarray(outcomes.gold, dtype=int), np.asarray(outcomes.predicted, dtype=int)), 1.0)
        return counts

    def public_scores(
        self, engine: Engine, prompt: str, examples: Sequence[Example], verbalizers: Mapping[str, str] | None = None
    ) -> np.ndarray:
        """1 for each record whose label is read right, else 0 (public or test records only)."""
        outcomes = self.public_outcomes(engine, prompt, examples, verbalizers)
        return np.asarray(outcomes.predicted == outcomes.gold, dtype=float)

    def mean_score(self, engine: Engine, prompt: str, examples: Sequence[Example] | None = None) -> float:
        """Test accuracy (the protocol's name for the mean score); see :meth:`accuracy`."""
        return self.accuracy(engine, prompt, examples)

    def accuracy(
        self,
        engine: Engine,
        prompt: str,
        examples: Sequence[Example] | None = None,
        verbalizers: Mapping[str, str] | None = None,
    ) -> float:
        """Test accuracy of ``prompt`` (research evaluation; not covered by the guarantee)."""
        examples = self.test if examples is None else examples
        if not examples:
            raise ValueError("test: no examples to evaluate on")
        return float(np.mean(self.public_scores(engine, prompt, examples, verbalizers)))
