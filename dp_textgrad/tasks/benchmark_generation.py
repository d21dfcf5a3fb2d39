"""Generation benchmarks on public data: SNIPS slot extraction and GSM8K.

Both read the benchmark data directory the way ``sst2`` and ``banking77`` do
(``data_dir=...``, else ``$DP_TEXTGRAD_DATA``, else ``../shared/data``; see its README);
the data are never copied into the package.

* ``snips``: the input is a voice-assistant request, the reference its slots as a JSON
  object (``{"artist": "Gloria Gaither", ...}``), the metric the slot F1 of
  :class:`SlotF1` (name-value pairs of the output's first JSON object against the
  reference's). ``train.jsonl`` is the private pool, minus a fixed public set of
  demonstrations drawn from it once (``SNIPS_PUBLIC_PER_INTENT`` per intent, seed
  ``PUBLIC_SEED``, whatever the run's seed), which plays the role of published examples;
  ``dev.jsonl`` is for tuning, ``test.jsonl`` for the final numbers.
* ``gsm8k``: the input is a math word problem, the reference its worked solution (the
  dataset's calculator marks ``<<...>>`` removed) ending in ``#### <answer>``; the metric
  is the numeric final answer (the output's last number against the number after ``####``).
  ``train.jsonl`` is the private pool (``n_private`` records, 200 as in the published DP
  evolution-strategy schedule), minus a fixed public set of worked demonstrations;
  ``test.jsonl`` the test set.

Errors name the file and line, never a record's text.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from dp_textgrad.privacy.data import PrivateDataset
from dp_textgrad.tasks.generation import GenerationExample, GenerationTask
from dp_textgrad.tasks.loaders import resolve_data_dir
from dp_textgrad.tasks.metrics import (
    CORRECT,
    EMPTY,
    PARTIAL,
    TOO_LONG,
    WRONG_ANSWER,
    WRONG_FORMAT,
    MetricBase,
    first_json_object,
    metric_from_name,
    normalize_answer,
)

__all__ = [
    "GSM8K_DESCRIPTION",
    "PUBLIC_SEED",
    "SLOT_CATEGORIES",
    "SNIPS_DESCRIPTION",
    "SNIPS_SEED_PROMPT",
    "SlotF1",
    "build_gsm8k",
    "build_snips",
    "load_gsm8k",
    "load_snips",
    "slot_f1",
    "slot_pairs",
]

# The public demonstrations are drawn with this seed, never the run's: the same public set
# (and so the same private pool) for every run and every method.
PUBLIC_SEED = 1234
SNIPS_PUBLIC_PER_INTENT = 2
GSM8K_PUBLIC_COUNT = 8

# -- slot F1 ------------------------------------------------------------------------------
WRONG_VALUES = "wrong_values"
SLOT_CATEGORIES = MappingProxyType(
    {
        CORRECT: "the output has exactly the expected slots with the expected values",
        EMPTY: "the output is empty or white space only",
        TOO_LONG: "the output ran into the max_new_tokens cap and is not fully right",
        WRONG_FORMAT: "the output holds no JSON object",
        PARTIAL: "some slot name-value pairs are right, others are missing or extra",
        WRONG_VALUES: "the output names some of the right slots but gives none of them the right value",
        WRONG_ANSWER: "no slot name of the output is one the request has",
    }
)
_MULTI_VALUE = " | "  # how the data join two values of one slot


def slot_pairs(slots: Mapping[str, Any]) -> Counter[tuple[str, str]]:
    """The (slot name, normalised value) pairs of a slot object, as a multiset.

    A value joined with " | " (a slot that occurs twice) or given as a list counts once per
    item; values compare after SQuAD normalisation (case, punctuation, articles, spaces);
    null or empty values count as absent.
    """
    pairs: Counter[tuple[str, str]] = Counter()
    for name, value in slots.items():
        items = value if isinstance(value, list) else str(value).split(_MULTI_VALUE) if value is not None else []
        for item in items:
            if item is None or isinstance(item, (dict, list)):
                continue
            text = normalize_answer(str(item))
            if text:
                pairs[(normalize_answer(str(name)).replace(" ", "_"), text)] += 1
    return pairs


def _reference_slots(reference: Any) -> Mapping[str, Any]:
    if isinstance(reference, Mapping):
        return reference
    if isinstance(reference, str):
        parsed = first_json_object(reference)
        if parsed is not None:
            return parsed
    raise ValueError("the reference is not a JSON object of slots")


def slot_f1(output: str, reference: Any) -> float:
    """Slot F1 of ``output``'s first JSON object against ``reference`` (see :class:`SlotF1`)."""
    expected = slot_pairs(_reference_slots(reference))
    found = first_json_object(output)
    if found is None:
        return 0.0
    predicted = slot_pairs(found)
    if not expected and not predicted:
        return 1.0
    right = sum((expected & predicted).values())
    return 2.0 * right / (sum(expected.values()) + sum(predicted.values()))


@dataclass(frozen=True)
class SlotF1(MetricBase):
    """Slot F1: the F1 of the (slot, value) pairs of the output's first JSON object against the reference's.

    Precision counts extra slots, recall missing ones; values compare after normalisation
    (:func:`slot_pairs`). An output without a JSON object scores 0; an empty reference and
    an empty object score 1. The failure categories (``SLOT_CATEGORIES``) tell a missing
    JSON object, right slot names with wrong values and a partial match apart.
    """

    categories: Mapping[str, str] = field(default_factory=lambda: SLOT_CATEGORIES, hash=False, repr=False)
    name: str = field(default="slot_f1", init=False)
    binary: bool = field(default=False, init=False)

    def score(self, output: str, reference: Any) -> float:
        return slot_f1(output, reference)

    def _category(self, output: str, reference: Any, score: float) -> str | None:
        found = first_json_object(output)
        if found is None:
            return WRONG_FORMAT
        if score > 0.0:
            return PARTIAL
        expected_names = {name for name, _ in slot_pairs(_reference_slots(reference))}
        found_names = {name for name, _ in slot_pairs(found)}
        return WRONG_VALUES if expected_names & found_names else WRONG_ANSWER


# -- reading the files ------------------------------------------------------------------------
def _read_jsonl(path: Path, fields: tuple[str, ...]) -> list[dict[str, Any]]:
    """The objects of a JSONL file, each checked for ``fields`` (errors name the line, not its text)."""
    if not path.is_file():
        raise FileNotFoundError(
            f"data_dir: {path} is missing; the benchmark data folder needs {path.parent.name}/{path.name} "
            "(see its README.md)"
        )
    rows: list[dict[str, Any]] = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                raise ValueError(f"{path.name}: line {number} is not valid JSON") from None
            missing = [name for name in fields if not isinstance(row, dict) or name not in row]
            if missing:
                raise ValueError(f"{path.name}: line {number} lacks the field(s) {missing}")
            rows.append(row)
    return rows


def load_snips(path: str | os.PathLike[str]) -> list[GenerationExample]:
    """A SNIPS JSONL file (``{"text", "intent", "slots"}`` per line) as generation examples.

    The reference is the ``slots`` object; the intent is dropped (slot extraction only).
    """
    examples = []
    for number, row in enumerate(_read_jsonl(Path(path), ("text", "slots")), 1):
        if not isinstance(row["slots"], dict):
            raise ValueError(f"{Path(path).name}: record {number}: 'slots' must be a JSON object")
        examples.append(GenerationExample(str(row["text"]), reference=dict(row["slots"])))
    return examples


_CALCULATOR = re.compile(r"<<[^<>]*>>")


def load_gsm8k(path: str | os.PathLike[str]) -> list[GenerationExample]:
    """A GSM8K JSONL file (``{"question", "answer"}`` per line) as generation examples.

    The reference is the worked solution without the calculator marks ``<<...>>``, ending in
    ``#### <answer>``: a demonstration shows the reasoning, and the numeric metric reads the
    number after ``####``.
    """
    examples = []
    for number, row in enumerate(_read_jsonl(Path(path), ("question", "answer")), 1):
        answer = str(row["answer"])
        if "####" not in answer:
            raise ValueError(f"{Path(path).name}: record {number}: 'answer' has no final '#### <number>'")
        examples.append(GenerationExample(str(row["question"]), reference=_CALCULATOR.sub("", answer).strip()))
    return examples


def _split_public(
    pool: list[GenerationExample], count: int, groups: list[str] | None = None
) -> tuple[list[GenerationExample], list[GenerationExample]]:
    """(public, rest): ``count`` records drawn with ``PUBLIC_SEED`` (per group when groups are given)."""
    rng = np.random.default_rng(PUBLIC_SEED)
    if groups is None:
        chosen = {int(i) for i in rng.choice(len(pool), size=min(count, len(pool)), replace=False)}
    else:
        chosen = set()
        for group in sorted(set(groups)):
            members = [i for i, g in enumerate(groups) if g == group]
            chosen.update(int(i) for i in rng.choice(members, size=min(count, len(members)), replace=False))
    public = [pool[i] for i in sorted(chosen)]
    rest = [example for i, example in enumerate(pool) if i not in chosen]
    return public, rest


def _sample(records: list[GenerationExample], n: int | None, rng: np.random.Generator) -> list[GenerationExample]:
    if n is None or n >= len(records):
        return records
    if n < 1:
        raise ValueError(f"n: must be >= 1 or None (all records), got {n}")
    return [records[int(i)] for i in sorted(rng.choice(len(records), size=n, replace=False))]


# -- SNIPS ------------------------------------------------------------------------------------
SNIPS_DESCRIPTION = (
    "Requests to a voice assistant (SNIPS: play music, add to a playlist, weather, restaurant "
    "booking, rate a book, find a creative work, find a screening). The task is to extract the "
    "request's slots (e.g. artist, playlist, city, timeRange, object_name) with their exact words "
    "as one JSON object on one line."
)
SNIPS_SEED_PROMPT = "Extract the slots of the request as a JSON object."


def build_snips(
    data_dir: str | os.PathLike[str] | None = None,
    *,
    split: str = "test",
    n_private: int | None = 2000,
    n_test: int | None = None,
    seed: int = 0,
    max_new_tokens: int = 64,
    public_inputs: int = 0,
    public_examples: bool = True,
) -> GenerationTask:
    """SNIPS slot extraction: ``train.jsonl`` private (``n_private`` drawn by ``seed``), ``split`` the test set.

    ``split``: "test" (final numbers) or "dev" (tuning). ``n_test`` records of it are drawn by
    ``seed`` (None: all). The public demonstrations (2 per intent from ``train.jsonl``) are
    fixed and never in the private pool; ``public_examples=False`` leaves them out (a task with no
    public labelled examples). ``public_inputs``: how many requests of ``train.jsonl`` outside the
    private pool and the public demonstrations to add WITHOUT their slots (drawn by ``seed``):
    what a labelling phase (``dp.labelling``) gives DP answers to.
    """
    if split not in ("test", "dev"):
        raise ValueError(f"split: use 'test' or 'dev', got {split!r}")
    root = resolve_data_dir(data_dir) / "snips"
    train_rows = _read_jsonl(root / "train.jsonl", ("text", "intent", "slots"))
    pool = load_snips(root / "train.jsonl")
    public, rest = _split_public(pool, SNIPS_PUBLIC_PER_INTENT, [str(row["intent"]) for row in train_rows])
    if isinstance(public_inputs, bool) or not isinstance(public_inputs, int) or public_inputs < 0:
        raise ValueError(f"public_inputs: must be an integer >= 0, got {public_inputs!r}")
    rng = np.random.default_rng(seed)
    private = _sample(rest, n_private, rng)
    test = _sample(load_snips(root / f"{split}.jsonl"), n_test, rng)
    # The pool has a stream of its own: asking for it leaves the private and test draws unchanged.
    chosen = {example.text for example in private}
    spare = [example.text for example in rest if example.text not in chosen]
    if public_inputs > len(spare):
        raise ValueError(
            f"public_inputs: asked for {public_inputs}, only {len(spare)} requests are left outside the private "
            "pool; lower public_inputs or n_private"
        )
    order = np.random.default_rng([int(seed), 7]).permutation(len(spare))
    unlabelled = [spare[int(i)] for i in order[:public_inputs]]
    return GenerationTask(
        name="snips",
        description=SNIPS_DESCRIPTION,
        private_train=PrivateDataset(private),
        test=test,
        metric=SlotF1(),
        public_examples=public if public_examples else [],
        record_template="Request: {text}\nSlots:",
        max_new_tokens=max_new_tokens,
        stop=("\n",),  # the answer is one line of JSON
        seed_prompt=SNIPS_SEED_PROMPT,
        public_inputs=unlabelled,
    )


# -- GSM8K ------------------------------------------------------------------------------------
GSM8K_DESCRIPTION = (
    "Grade-school math word problems (GSM8K). The task is to reason step by step and end with "
    "the final numeric answer on its own line as '#### <number>'."
)
GSM8K_SEED_PROMPT = "Solve the math problem step by step. End with '#### ' and the final number."


def build_gsm8k(
    data_dir: str | os.PathLike[str] | None = None,
    *,
    n_private: int | None = 200,
    n_test: int | None = None,
    seed: int = 0,
    max_new_tokens: int = 256,
) -> GenerationTask:
    """GSM8K: ``n_private`` records of ``train.jsonl`` (drawn by ``seed``) private, ``test.jsonl`` the test set.

    ``n_test`` test records drawn by ``seed`` (None: all 1,319). Eight worked solutions from
    ``train.jsonl`` (fixed, never private) are the public demonstrations.
    """
    root = resolve_data_dir(data_dir) / "gsm8k"
    public, rest = _split_public(load_gsm8k(root / "train.jsonl"), GSM8K_PUBLIC_COUNT)
    rng = np.random.default_rng(seed)
    private = _sample(rest, n_private, rng)
    test = _sample(load_gsm8k(root / "test.jsonl"), n_test, rng)
    return GenerationTask(
        name="gsm8k",
        description=GSM8K_DESCRIPTION,
        private_train=PrivateDataset(private),
        test=test,
        metric=metric_from_name("numeric"),
        public_examples=public,
        record_template="Question: {text}\nAnswer:",
        max_new_tokens=max_new_tokens,
        stop=("\n\n", "\nQuestion:"),
        seed_prompt=GSM8K_SEED_PROMPT,
    )
