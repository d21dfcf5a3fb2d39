"""Generation tasks: a prompt that writes an answer, scored by a metric against a reference.

The model input is the one classification uses::

    <candidate prompt>\\n\\n<record_template with the record's text>

and the engine continues it greedily (``temperature`` 0 by default) for at most the public
``max_new_tokens``, stopping at ``stop``. The metric (:mod:`dp_textgrad.tasks.metrics`)
scores the output against the record's reference in [0, 1]; the task clips it to [0, C].
A metric that raises, or a grade that does not parse, scores 0 for that record, and a
categorisation rule that raises (or names no category) puts it in the catch-all category:
rules that are the same for every record, so one record still moves a sum by at most C and
adds exactly one unit to the failure histogram.

Everything computed from a private record here (the output, its length, the metric's and a
judge's calls and text, the time taken) is private: it stays in the scorer's frame. What
leaves is the clipped score sum and, for DP feedback, a histogram over the metric's PUBLIC
failure categories, to which each record adds exactly one unit (:meth:`feedback_counts`).

Private records are generated one at a time after a prompt prefix (the engine's
``generate_after_prefix``), or one record under all the candidate prompts of a charge (its
``generate_for_prefixes``, :meth:`GenerationTask.private_outcomes_many`), never batched together
with other records: an output that depended on the other records of a batch would break the
per-record sensitivity.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from dp_textgrad.privacy.data import PrivateBatch, PrivateDataset
from dp_textgrad.tasks.base import Example, FeedbackSpec
from dp_textgrad.tasks.metrics import Metric, safe_score
from dp_textgrad.tasks.record_format import (
    check_record_format,
    fill_record_format,
    format_stops,
    split_record_format,
)

if TYPE_CHECKING:
    from dp_textgrad.engines.base import Engine

DEFAULT_GENERATION_TEMPLATE = "Input: {text}\nOutput:"
DEFAULT_STOP = ("\n\n", "\nInput:")


@dataclass(frozen=True)
class GenerationExample(Example):
    """One input with its reference answer (text, a list of accepted answers, or a JSON object).

    ``label`` is only the demonstration group the demo operators balance over; generation
    examples share one group (the empty string).
    """

    label: str = ""
    reference: Any = None


def reference_text(reference: Any) -> str:
    """How a reference is written as a demonstration's answer: text as it is, the first of a
    list of accepted answers, a JSON object or list compactly as JSON."""
    if isinstance(reference, str):
        return reference
    if isinstance(reference, (list, tuple)) and reference and all(isinstance(r, str) for r in reference):
        return reference[0]
    return json.dumps(reference, ensure_ascii=False)


@dataclass(frozen=True)
class GenerationOutcomes:
    """What one candidate did on a batch of records (private until noised).

    ``scores``: clipped per-record scores in [0, C], shape (n,); ``categories``: the index of
    each record's failure category in the task's ``feedback.names``, shape (n,).
    """

    scores: np.ndarray
    categories: np.ndarray


@dataclass
class GenerationTask:
    """A task whose prompt generates text, scored per record by ``metric`` (see the module docstring).

    ``max_new_tokens`` (the public cap on an output), ``stop`` and ``temperature`` are the
    generation settings, fixed before anything is charged; the preflight checks that the
    prompt, a record at the record cap and ``max_new_tokens`` fit the engine's context.
    ``public_inputs`` are public inputs without answers (a labelling phase gives them DP
    answers, ``dp.labelling``).
    """

    name: str
    description: str
    private_train: PrivateDataset[GenerationExample]
    test: list[GenerationExample]
    metric: Metric
    public_examples: list[GenerationExample] = field(default_factory=list)
    record_template: str = DEFAULT_GENERATION_TEMPLATE
    max_new_tokens: int = 64
    stop: tuple[str, ...] = DEFAULT_STOP
    temperature: float = 0.0
    clip_bound: float = 1.0
    seed_prompt: str = ""
    # Public inputs without answers: what a labelling phase (dp.labelling) gives DP answers to.
    public_inputs: list[str] = field(default_factory=list)
    # Public record formats the search may try instead of record_template (tasks.record_format);
    # none by default: measured, generic ones scored below a task's own template (docs/benchmarks.md).
    record_formats: tuple[str, ...] = ()

    kind = "generate"

    def __post_init__(self) -> None:
        if "{text}" not in self.record_template:
            raise ValueError("record_template: must contain the placeholder {text}")
        if not isinstance(self.metric, Metric):
            raise TypeError(
                "metric: needs name, binary, categories, score(output, reference) and categorise(...); "
                "build one with tasks.metrics.metric_from_name"
            )
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens: must be an int >= 1, got {self.max_new_tokens!r}")
        if not (self.temperature >= 0 and np.isfinite(self.temperature)):
            raise ValueError(f"temperature: must be a finite number >= 0, got {self.temperature}")
        if not (self.clip_bound > 0 and np.isfinite(self.clip_bound)):
            raise ValueError("clip_bound: must be > 0")
        self.stop = tuple(str(s) for s in self.stop)
        own = self.record_template.strip()
        formats = [check_record_format(f, f"record_formats[{i}]") for i, f in enumerate(self.record_formats)]
        # The task's own template is the format of a prompt without one: not an alternative.
        self.record_formats = tuple(dict.fromkeys(f for f in formats if f != own))
        if any(not s for s in self.stop):
            raise ValueError("stop: stop strings must be non-empty")
        if not self.metric.categories:
            raise ValueError("metric.categories: the metric needs at least one public failure category")
        for split_name, split in (("test", self.test), ("public_examples", self.public_examples)):
            for position, example in enumerate(split):
                if not isinstance(example, GenerationExample):
                    raise TypeError(f"{split_name}[{position}]: expected a GenerationExample")
                if example.reference is None:
                    raise ValueError(f"{split_name}[{position}]: has no reference answer")
        bad_inputs = [i for i, text in enumerate(self.public_inputs) if not isinstance(text, str) or not text.strip()]
        if bad_inputs:
            raise ValueError(
                f"public_inputs: item(s) {bad_inputs[:5]} are not text; every public input must be a non-empty string"
            )
        # Private records are checked without revealing which ones fail (counts only).
        records = [rec.unwrap() for rec in self.private_train]
        bad_type = sum(1 for r in records if not isinstance(r, GenerationExample))
        if bad_type:
            raise TypeError(f"private_train: {bad_type} record(s) are not GenerationExample objects")
        empty = sum(1 for r in records if not r.text.strip())
        if empty:
            raise ValueError(
                f"private_train: {empty} record(s) have empty input text; drop them before building the task"
            )
        missing = sum(1 for r in records if r.reference is None)
        if missing:
            raise ValueError(f"private_train: {missing} record(s) have no reference answer; drop or fill them")

    # -- the protocol's public descriptions ---------------------------------------------
    @property
    def labels(self) -> list[str]:
        """No label set: a generation task's outputs are free text."""
        return []

    @property
    def metric_name(self) -> str:
        return str(self.metric.name)

    @property
    def binary_scores(self) -> bool:
        return bool(self.metric.binary)

    @property
    def feedback(self) -> FeedbackSpec:
        categories = self.metric.categories
        return FeedbackSpec("failures", tuple(categories), tuple(categories[name] for name in categories))

    def with_bounded_records(
        self,
        count_tokens: Callable[[str], int],
        truncate: Callable[[str, int], str],
        max_tokens: int,
        policy: str = "truncate",
    ) -> GenerationTask:
        """This task with every private input at most ``max_tokens`` long (a public cap; see
        ``ClassificationTask.with_bounded_records``). References are not cut: they never reach
        the model's input."""
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
            records[i] = replace(records[i], text=truncate(records[i].text, max_tokens))
        return replace(self, private_train=PrivateDataset(records))

    # -- rendering ------------------------------------------------------------------
    # A prompt may end with its own record format (a paragraph holding {text}); the others use
    # record_template. Everything here is public: the prompt, its format and the settings.
    def record_format_of(self, prompt: str | None) -> str | None:
        """``prompt``'s own record format, or None (it uses ``record_template``)."""
        return None if prompt is None else split_record_format(prompt)[1]

    def render_prefix(self, prompt: str) -> str:
        body = split_record_format(prompt)[0]
        return body.rstrip() + "\n\n" if body.strip() else ""

    def render_record(self, text: str, prompt: str | None = None) -> str:
        """``text`` in ``prompt``'s record format (``record_template`` for a prompt without one)."""
        record_format = self.record_format_of(prompt)
        if record_format is None:
            return self.record_template.format(text=text)
        return fill_record_format(record_format, text)

    def stop_for(self, prompt: str | None) -> tuple[str, ...]:
        """The stop strings under ``prompt``: the task's, and its own format's next-record label."""
        return format_stops(self.record_format_of(prompt), self.stop)

    def render_demo(self, example: Example, record_format: str | None = None) -> str:
        """A public example as a demonstration: its input, then its reference answer, in
        ``record_format`` (default: ``record_template``)."""
        reference = getattr(example, "reference", None)
        answer = reference_text(reference) if reference is not None else example.label
        if record_format is None:
            return self.render_record(example.text) + " " + answer.strip()
        return fill_record_format(record_format, example.text) + " " + answer.strip()

    # -- generating and scoring -----------------------------------------------------
    def generate(self, engine: Engine, prompt: str, texts: Sequence[str]) -> list[str]:
        """The outputs for ``texts`` after ``prompt``, each depending on its own record only."""
        if not texts:
            return []
        outputs = engine.generate_after_prefix(
            self.render_prefix(prompt),
            [self.render_record(t, prompt) for t in texts],
            max_tokens=self.max_new_tokens,
            stop=self.stop_for(prompt),
            temperature=self.temperature,
        )
        if len(outputs) != len(texts):
            raise RuntimeError("engine.generate_after_prefix: returned the wrong number of outputs")
        return [str(o) for o in outputs]

    def generate_for_prompts(self, engine: Engine, prompts: Sequence[str], text: str) -> list[str]:
        """The outputs of ONE record under each prompt (``engine.generate_for_prefixes``), each
        depending on the prompts and this record only. Prompts with the same record format
        share a call (the record's text after them is the same); each call holds this record
        only."""
        if not prompts:
            return []
        groups: dict[str | None, list[int]] = {}
        for position, prompt in enumerate(prompts):
            groups.setdefault(self.record_format_of(prompt), []).append(position)
        outputs: list[str | None] = [None] * len(prompts)
        for positions in groups.values():  # in order of first appearance: public, fixed
            first = prompts[positions[0]]
            group_outputs = engine.generate_for_prefixes(
                [self.render_prefix(prompts[p]) for p in positions],
                self.render_record(text, first),
                max_tokens=self.max_new_tokens,
                stop=self.stop_for(first),
                temperature=self.temperature,
            )
            if len(group_outputs) != len(positions):
                raise RuntimeError("engine.generate_for_prefixes: returned the wrong number of outputs")
            for p, output in zip(positions, group_outputs, strict=True):
                outputs[p] = str(output)
        return [str(o) for o in outputs]

    def _outcomes(self, engine: Engine, prompt: str, examples: Sequence[GenerationExample]) -> GenerationOutcomes:
        return self._scored(engine, self.generate(engine, prompt, [e.text for e in examples]), examples)

    def _outcomes_many(
        self, engine: Engine, prompts: Sequence[str], examples: Sequence[GenerationExample]
    ) -> list[GenerationOutcomes]:
        # Record-major where the engine decodes the prompts together (engine.batches_prefixes):
        # each record under every prompt in one call, never two records in a call. Otherwise
        # prompt by prompt, which lets a concurrent engine (OpenAI) spread a prompt over records.
        if not getattr(engine, "batches_prefixes", False):
            return [self._outcomes(engine, p, examples) for p in prompts]
        per_prompt: list[list[str]] = [[] for _ in prompts]
        for example in examples:
            for k, output in enumerate(self.generate_for_prompts(engine, prompts, example.text)):
                per_prompt[k].append(output)
        return [self._scored(engine, outputs, examples) for outputs in per_prompt]

    def _scored(
        self, engine: Engine, outputs: Sequence[str], examples: Sequence[GenerationExample]
    ) -> GenerationOutcomes:
        """Scores and failure categories of ``outputs`` (one per example): the one scoring routine."""
        names = list(self.metric.categories)
        count = getattr(engine, "count_tokens", None)
        scores = np.zeros(len(examples))
        categories = np.zeros(len(examples), dtype=int)
        for i, (output, example) in enumerate(zip(outputs, examples, strict=True)):
            value = safe_score(self.metric, output, example.reference)
            scores[i] = value * self.clip_bound
            try:  # the cap was hit: a public rule on the output's own length
                hit = bool(callable(count) and count(output) >= self.max_new_tokens)
            except Exception:  # noqa: BLE001 - the length is private; a failing count means "not hit"
                hit = False
            try:  # a user's rule may raise: like a failing score, that must not stop the run
                category = self.metric.categorise(output, example.reference, hit, score=value)
            except Exception:  # noqa: BLE001 - its text may quote the private output; dropped
                category = None
            # A rule that names no category (or fails): the catch-all, the same for every record.
            if not isinstance(category, str) or category not in names:
                category = "wrong_answer" if "wrong_answer" in names else names[-1]
            categories[i] = names.index(category)
        return GenerationOutcomes(scores=scores, categories=categories)

    def private_outcomes(
        self, engine: Engine, prompt: str, batch: PrivateBatch[GenerationExample]
    ) -> GenerationOutcomes:
        """Outcomes on private records. Call only from a DP mechanism."""
        return self._outcomes(engine, prompt, [rec.unwrap() for rec in batch])

    def public_outcomes(self, engine: Engine, prompt: str, examples: Sequence[GenerationExample]) -> GenerationOutcomes:
        """Outcomes on public or test records (no privacy involved)."""
        return self._outcomes(engine, prompt, list(examples))

    def private_outcomes_many(
        self, engine: Engine, prompts: Sequence[str], batch: PrivateBatch[GenerationExample]
    ) -> list[GenerationOutcomes]:
        """Outcomes of every prompt on private records, one per prompt. Where the engine batches
        prompts (``engine.batches_prefixes``), each record is generated under all the prompts
        together (``engine.generate_for_prefixes``), never with another record, so one record
        still changes only its own outputs; otherwise as :meth:`private_outcomes` per prompt.
        Call only from a DP mechanism."""
        return self._outcomes_many(engine, list(prompts), [rec.unwrap() for rec in batch])

    def public_outcomes_many(
        self, engine: Engine, prompts: Sequence[str], examples: Sequence[GenerationExample]
    ) -> list[GenerationOutcomes]:
        """:meth:`private_outcomes_many` on public or test records (no privacy involved)."""
        return self._outcomes_many(engine, list(prompts), list(examples))

    def feedback_counts(self, outcomes: GenerationOutcomes) -> np.ndarray:
        """The failure histogram of ``outcomes``: each record adds 1 to its category."""
        return np.bincount(np.asarray(outcomes.categories, dtype=int), minlength=len(self.metric.categories)).astype(
            float
        )

    def public_scores(self, engine: Engine, prompt: str, examples: Sequence[GenerationExample]) -> np.ndarray:
        """Per-record metric scores in [0, 1] on public or test records (evaluation)."""
        return np.asarray(self.public_outcomes(engine, prompt, examples).scores, dtype=float) / self.clip_bound

    def mean_score(self, engine: Engine, prompt: str, examples: Sequence[GenerationExample] | None = None) -> float:
        """Mean metric score of ``prompt`` on the test split (research evaluation; not covered by DP)."""
        examples = self.test if examples is None else examples
        if not examples:
            raise ValueError("test: no examples to evaluate on")
        return float(np.mean(self.public_scores(engine, prompt, examples)))


__all__ = ["DEFAULT_STOP", "GenerationExample", "GenerationOutcomes", "GenerationTask", "reference_text"]
