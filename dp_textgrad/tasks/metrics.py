"""Metrics for generation tasks: how one generated output is scored against its reference.

A metric turns ``(output, reference)`` into a score in [0, 1]; the generation task clips it
to [0, C] and the scorer sums it under DP. Built in, by the name a run file gives:

- ``exact``: normalised exact match (SQuAD normalisation: lower case, no punctuation, no
  articles, white space collapsed); a list of references counts the best one.
- ``f1``: SQuAD token F1 on the same normalisation.
- ``numeric``: GSM8K-style final answer: the last number in the output against the number
  after ``####`` in the reference (or its last number); commas and ``$`` dropped, compared as
  numbers within ``tolerance``.
- ``rouge_l``: ROUGE-L F-measure from the ``rouge-score`` package.
- ``json_fields``: the fraction of chosen ``fields`` (dotted paths) of the output's first
  JSON object that equal the reference's, after normalisation.
- ``regex``: 1 when the output matches the reference as a pattern (or the ``pattern`` option
  with ``{reference}`` in it).
- ``python:MODULE:FUNCTION``: any callable ``(output, reference) -> float``.

``JudgeMetric`` asks a judge engine with a rubric and parses the grade; ``TextGradLossMetric``
asks a TextGrad loss module (``textgrad.loss.TextLoss``, ``MultiFieldEvaluation``) for its
evaluation text and parses the grade from it the same way (``parse_grade``).

Scores are private (they come from private records): ``safe_score`` gives 0 for a metric that
raises or answers anything but a finite number in [0, 1], a data-independent rule, and never
logs or raises. Each metric also has public failure categories (``categories``: name -> one
line) and a rule, ``categorise``, that puts one output into exactly one of them, for the DP
histogram of failures.
"""

from __future__ import annotations

import importlib
import json
import math
import re
import string
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from dp_textgrad.tasks.base import ERROR_CATEGORY, ERROR_DESCRIPTION

if TYPE_CHECKING:
    from dp_textgrad.engines.base import Engine

__all__ = [
    "METRIC_NAMES",
    "CallableMetric",
    "ExactMatch",
    "JsonFieldsMatch",
    "JudgeMetric",
    "Metric",
    "MetricBase",
    "NumericAnswer",
    "RegexMatch",
    "RougeL",
    "TextGradLossMetric",
    "TokenF1",
    "judge_from_options",
    "metric_from_name",
    "normalize_answer",
    "parse_grade",
    "safe_score",
]

METRIC_NAMES = ("exact", "f1", "numeric", "rouge_l", "json_fields", "regex", "python:MODULE:FUNCTION")


@runtime_checkable
class Metric(Protocol):
    """What a generation task needs from a metric.

    ``name``: shown in reports. ``binary``: every score is 0 or 1 (Wilson and McNemar
    intervals apply); otherwise a bootstrap. ``categories``: the public failure categories,
    name -> one-line description. ``score`` is in [0, 1]; ``categorise`` names exactly one
    of ``categories`` for one output (``score``: the score already computed, so a judge is not
    asked twice).
    """

    @property
    def name(self) -> str: ...

    @property
    def binary(self) -> bool: ...

    @property
    def categories(self) -> Mapping[str, str]: ...

    def score(self, output: str, reference: Any) -> float: ...

    def categorise(
        self, output: str, reference: Any, max_new_tokens_hit: bool, *, score: float | None = None
    ) -> str: ...


def safe_score(metric: Metric, output: str, reference: Any) -> float:
    """The metric's score, or 0.0 when it raises or answers anything but a finite number in [0, 1].

    A data-independent rule: the same for every record, so one record still changes a sum
    by at most C. It never raises (only ``BaseException``s such as ``KeyboardInterrupt`` that
    are not ``Exception``s pass through) and never logs or keeps the output, the reference or
    the error: all three are private.
    """
    try:
        value = float(metric.score(output, reference))
    except Exception:  # noqa: BLE001 - any failure scores 0; its text is private and dropped
        return 0.0
    if not math.isfinite(value) or value < 0.0 or value > 1.0:
        return 0.0
    return value


# -- failure categories -------------------------------------------------------------------
CORRECT = "correct"
EMPTY = "empty"
TOO_LONG = "too_long"
WRONG_FORMAT = "wrong_format"
EXTRA_TEXT = "extra_text"
PARTIAL = "partial"
LOW_OVERLAP = "low_overlap"
MISSING_FIELDS = "missing_fields"
WRONG_ANSWER = "wrong_answer"

_COMMON = {
    CORRECT: "the output gets full marks",
    EMPTY: "the output is empty or white space only",
    TOO_LONG: "the output ran into the max_new_tokens cap and is not fully right",
    ERROR_CATEGORY: ERROR_DESCRIPTION,  # no output: the engine call failed (tasks.base)
}


def _categories(**specific: str) -> Mapping[str, str]:
    return MappingProxyType({**_COMMON, **specific})


EXACT_CATEGORIES = _categories(
    extra_text="the expected answer is in the output, with other words around it",
    partial="the output shares some words with the expected answer",
    wrong_answer="the output shares no word with the expected answer",
)
F1_CATEGORIES = EXACT_CATEGORIES
NUMERIC_CATEGORIES = _categories(
    wrong_format="the output holds no number",
    wrong_answer="the output's last number is not the expected one",
)
ROUGE_CATEGORIES = _categories(
    partial="the output shares at least half of the reference's words in order (ROUGE-L F >= 0.5)",
    low_overlap="the output shares a few of the reference's words (0 < ROUGE-L F < 0.5)",
    wrong_answer="the output shares no word with the reference",
)
JSON_CATEGORIES = _categories(
    wrong_format="the output holds no JSON object",
    missing_fields="the JSON object lacks some of the chosen fields",
    partial="some of the chosen fields are right",
    wrong_answer="every chosen field is there and none is right",
)
REGEX_CATEGORIES = _categories(wrong_answer="the output does not match the expected pattern")
GRADED_CATEGORIES = _categories(
    partial="the output is partly right (a score between 0 and 1)",
    wrong_answer="the output scores 0",
)
BINARY_CATEGORIES = _categories(wrong_answer="the output scores 0")


class MetricBase:
    """The categorisation rule the built-in metrics share (subclasses define ``score``).

    In this order: ``empty`` (white space only); ``correct`` (score 1); ``too_long`` (the
    ``max_new_tokens`` cap was hit); the metric's own rule (``_category``: wrong format,
    missing fields, extra text, ...); ``partial`` for a score above 0 where the metric has
    it; else ``wrong_answer``. It never raises: a failing rule gives ``wrong_answer``.
    """

    name: str
    binary: bool
    categories: Mapping[str, str]

    def score(self, output: str, reference: Any) -> float:
        raise NotImplementedError

    def categorise(self, output: str, reference: Any, max_new_tokens_hit: bool, *, score: float | None = None) -> str:
        """The one category of ``categories`` this output falls in (see the class docstring)."""
        try:
            if not output.strip():
                return EMPTY
            value = safe_score(self, output, reference) if score is None else _valid_or_zero(score)
            if value >= 1.0:
                return CORRECT
            if max_new_tokens_hit:
                return TOO_LONG
            specific = self._category(output, reference, value)
            if specific is not None and specific in self.categories:
                return specific
            if value > 0.0 and PARTIAL in self.categories:
                return PARTIAL
        except Exception:  # noqa: BLE001 - a failing rule is a wrong answer; its text is private
            pass
        return WRONG_ANSWER

    def _category(self, output: str, reference: Any, score: float) -> str | None:
        """The metric's own rule between ``too_long`` and ``partial`` (None: no opinion)."""
        return None


def _valid_or_zero(value: float) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return 0.0
    return number if math.isfinite(number) and 0.0 <= number <= 1.0 else 0.0


def _with_categories(defaults: Mapping[str, str], given: Mapping[str, str] | None) -> Mapping[str, str]:
    """The default categories, their descriptions replaced where ``given`` names them.

    User-defined category names need a rule that knows them (the judge's, coming with the
    generation task); until then only the defaults can be re-described.
    """
    if given is None:
        return defaults
    if not isinstance(given, Mapping):
        raise ValueError("task.categories: give a mapping of category name -> one-line description")
    unknown = sorted(str(name) for name in given if name not in defaults)
    if unknown:
        raise ValueError(
            f"task.categories: unknown categories {unknown} for this metric; the rule knows only "
            f"{list(defaults)} (re-describe those, or leave task.categories out)"
        )
    for name, text in given.items():
        if not isinstance(text, str) or not text.strip() or "\n" in text:
            raise ValueError(f"task.categories.{name}: the description must be one non-empty line of text")
    return MappingProxyType({name: given.get(name, text) for name, text in defaults.items()})


# -- text normalisation (SQuAD) ----------------------------------------------------------
_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """SQuAD's normalisation: lower case, punctuation removed, articles removed, white space collapsed."""
    lowered = text.lower()
    no_punctuation = "".join(ch for ch in lowered if ch not in _PUNCTUATION)
    no_articles = _ARTICLES.sub(" ", no_punctuation)
    return " ".join(no_articles.split())


def _answers(reference: Any) -> list[str]:
    """A reference as a list of acceptable answers (a list or tuple means several)."""
    if isinstance(reference, list | tuple):
        if not reference:
            raise ValueError("an empty list of reference answers")
        return [_as_text(item) for item in reference]
    return [_as_text(reference)]


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping | list | tuple):
        return json.dumps(value, ensure_ascii=False, sort_keys=True)
    return "" if value is None else str(value)


def _token_f1(output_tokens: list[str], reference_tokens: list[str]) -> float:
    if not output_tokens or not reference_tokens:
        return float(output_tokens == reference_tokens)  # both empty: a match (SQuAD 2.0)
    same = sum((Counter(output_tokens) & Counter(reference_tokens)).values())
    if same == 0:
        return 0.0
    precision = same / len(output_tokens)
    recall = same / len(reference_tokens)
    return 2 * precision * recall / (precision + recall)


def _text_category(output: str, reference: Any) -> str | None:
    """``extra_text`` when a normalised answer sits whole inside the normalised output."""
    padded = f" {normalize_answer(output)} "
    for answer in _answers(reference):
        normal = normalize_answer(answer)
        if normal and f" {normal} " in padded:
            return EXTRA_TEXT
    return None


@dataclass(frozen=True)
class ExactMatch(MetricBase):
    """Normalised exact match (SQuAD): 1 when the output equals a reference answer after ``normalize_answer``."""

    categories: Mapping[str, str] = field(default_factory=lambda: EXACT_CATEGORIES, hash=False, repr=False)
    name: str = field(default="exact", init=False)
    binary: bool = field(default=True, init=False)

    def score(self, output: str, reference: Any) -> float:
        normal = normalize_answer(output)
        return float(any(normal == normalize_answer(answer) for answer in _answers(reference)))

    def _category(self, output: str, reference: Any, score: float) -> str | None:
        if _text_category(output, reference) is not None:
            return EXTRA_TEXT
        tokens = normalize_answer(output).split()
        overlap = max(_token_f1(tokens, normalize_answer(answer).split()) for answer in _answers(reference))
        return PARTIAL if overlap > 0 else WRONG_ANSWER


@dataclass(frozen=True)
class TokenF1(MetricBase):
    """SQuAD token F1 between the normalised output and the best reference answer."""

    categories: Mapping[str, str] = field(default_factory=lambda: F1_CATEGORIES, hash=False, repr=False)
    name: str = field(default="f1", init=False)
    binary: bool = field(default=False, init=False)

    def score(self, output: str, reference: Any) -> float:
        tokens = normalize_answer(output).split()
        return max(_token_f1(tokens, normalize_answer(answer).split()) for answer in _answers(reference))

    def _category(self, output: str, reference: Any, score: float) -> str | None:
        return _text_category(output, reference)


# -- numbers (GSM8K) ---------------------------------------------------------------------
# A number: an optional minus (not right after a letter or digit, so "3-4" reads 3 and 4),
# an optional "$", digits with thousands commas and an optional decimal part, or ".5".
_NUMBER = re.compile(r"(?:(?<![\w.])-)?\$?(?:\d[\d,]*(?:\.\d+)?|\.\d+)")
_FINAL_MARK = "####"


def _to_number(text: str) -> float:
    return float(text.replace(",", "").replace("$", ""))


def last_number(text: str) -> float | None:
    """The last number in ``text`` (commas and ``$`` dropped), or None when it has none."""
    found = None
    for match in _NUMBER.finditer(text):
        found = match.group(0)
    if found is None:
        return None
    try:
        return _to_number(found)
    except ValueError:  # a stray comma only, e.g. "$,": not a number
        return None


def reference_number(reference: Any) -> float:
    """The reference's number: a number as is, else the last number after ``####``, else the last number."""
    if isinstance(reference, bool):
        raise ValueError("a boolean is not a numeric reference")
    if isinstance(reference, int | float):
        return float(reference)
    text = _as_text(reference)
    if _FINAL_MARK in text:
        text = text.rsplit(_FINAL_MARK, 1)[1]
    number = last_number(text)
    if number is None:
        raise ValueError("the reference holds no number")
    return number


@dataclass(frozen=True)
class NumericAnswer(MetricBase):
    """GSM8K-style final answer: the output's last number equals the reference's within the tolerances."""

    tolerance: float = 1e-6
    relative_tolerance: float = 0.0
    categories: Mapping[str, str] = field(default_factory=lambda: NUMERIC_CATEGORIES, hash=False, repr=False)
    name: str = field(default="numeric", init=False)
    binary: bool = field(default=True, init=False)

    def __post_init__(self) -> None:
        for option in ("tolerance", "relative_tolerance"):
            value = getattr(self, option)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0 or math.isinf(value):
                raise ValueError(f"task.metric_options.{option}: must be a finite number >= 0, got {value!r}")

    def score(self, output: str, reference: Any) -> float:
        expected = reference_number(reference)
        answer = last_number(output)
        if answer is None:
            return 0.0
        return float(math.isclose(answer, expected, rel_tol=self.relative_tolerance, abs_tol=self.tolerance))

    def _category(self, output: str, reference: Any, score: float) -> str | None:
        return WRONG_FORMAT if last_number(output) is None else WRONG_ANSWER


# -- ROUGE-L -----------------------------------------------------------------------------
@dataclass(frozen=True)
class RougeL(MetricBase):
    """ROUGE-L F-measure (``rouge-score``), best over the reference answers.

    ``use_stemmer``: Porter stemming of both texts (``rouge-score``'s option). Its tokenizer
    keeps ASCII letters and digits only, as the original ROUGE does: text in other scripts
    scores 0.
    """

    use_stemmer: bool = True
    categories: Mapping[str, str] = field(default_factory=lambda: ROUGE_CATEGORIES, hash=False, repr=False)
    name: str = field(default="rouge_l", init=False)
    binary: bool = field(default=False, init=False)
    _scorer: Any = field(default=None, init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        if not isinstance(self.use_stemmer, bool):
            raise ValueError(f"task.metric_options.use_stemmer: must be true or false, got {self.use_stemmer!r}")
        from rouge_score import rouge_scorer, tokenizers  # imported when the metric is built: it loads nltk

        # rouge-score's own tokenizer, passed in: left to choose it, rouge-score logs through absl,
        # which installs a handler on the application's root logger (logging.basicConfig).
        tokenizer = tokenizers.DefaultTokenizer(use_stemmer=self.use_stemmer)
        object.__setattr__(self, "_scorer", rouge_scorer.RougeScorer(["rougeL"], tokenizer=tokenizer))

    def score(self, output: str, reference: Any) -> float:
        return max(float(self._scorer.score(answer, output)["rougeL"].fmeasure) for answer in _answers(reference))

    def _category(self, output: str, reference: Any, score: float) -> str | None:
        if score >= 0.5:
            return PARTIAL
        return LOW_OVERLAP if score > 0.0 else WRONG_ANSWER


# -- JSON fields -------------------------------------------------------------------------
_FENCE = re.compile(r"```[ \t]*[A-Za-z0-9_-]*[ \t]*\n?(.*?)```", re.DOTALL)
_MISSING = object()


def first_json_object(text: str) -> dict[str, Any] | None:
    """The first JSON object in ``text``: inside code fences first, then anywhere; None if there is none."""
    decoder = json.JSONDecoder()
    candidates = [match.group(1) for match in _FENCE.finditer(text)] + [text]
    for candidate in candidates:
        start = candidate.find("{")
        while start >= 0:
            try:
                value, _ = decoder.raw_decode(candidate, start)
            except ValueError:
                pass
            else:
                if isinstance(value, dict):
                    return value
            start = candidate.find("{", start + 1)
    return None


def _field_value(document: Any, path: str) -> Any:
    """The value at a dotted path (``a.b.0.c``: a digit indexes a list), or ``_MISSING``."""
    value = document
    for part in path.split("."):
        if isinstance(value, Mapping):
            if part not in value:
                return _MISSING
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return _MISSING
    return value


def _normal_value(value: Any) -> Any:
    """A JSON value for comparison: null and missing alike, numbers as numbers (also in
    strings), text normalised, lists as multisets, objects field by field."""
    if value is _MISSING or value is None:
        return None
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int | float):
        return ("number", float(value))
    if isinstance(value, str):
        stripped = value.strip()
        if _NUMBER.fullmatch(stripped):
            try:
                return ("number", _to_number(stripped))
            except ValueError:
                pass
        return ("text", normalize_answer(value))
    if isinstance(value, list):
        return ("list", tuple(sorted(repr(_normal_value(item)) for item in value)))
    if isinstance(value, Mapping):
        return ("object", tuple(sorted((str(key), repr(_normal_value(item))) for key, item in value.items())))
    return ("other", repr(value))


def _leaf_paths(document: Mapping[str, Any], prefix: str = "") -> list[str]:
    paths: list[str] = []
    for key, value in document.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            paths.extend(_leaf_paths(value, path + "."))
        else:
            paths.append(path)
    return paths


def _reference_object(reference: Any) -> Mapping[str, Any]:
    if isinstance(reference, Mapping):
        return reference
    if isinstance(reference, str):
        parsed = first_json_object(reference)
        if parsed is not None:
            return parsed
    raise ValueError("the reference is not a JSON object")


@dataclass(frozen=True)
class JsonFieldsMatch(MetricBase):
    """The fraction of ``fields`` (dotted paths) of the output's first JSON object that equal the reference's.

    The output's object may sit in code fences or in other text; no object scores 0. Values
    compare after normalisation: null equals a missing field, numbers compare as numbers
    (``"1,234"`` equals ``1234``), text as ``normalize_answer``, lists as multisets. Without
    ``fields``, every leaf of the reference object counts. ``require_all``: 1 only when every
    field is right (a binary metric).
    """

    fields: tuple[str, ...] = ()
    require_all: bool = False
    categories: Mapping[str, str] = field(default_factory=lambda: JSON_CATEGORIES, hash=False, repr=False)
    name: str = field(default="json_fields", init=False)
    binary: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        raw: Any = self.fields
        if isinstance(raw, str) or not isinstance(raw, Sequence):
            raise ValueError(f"task.metric_options.fields: give a list of dotted field paths, got {raw!r}")
        paths = tuple(raw)
        if not all(isinstance(path, str) and path and "" not in path.split(".") for path in paths):
            raise ValueError(f"task.metric_options.fields: every field is a dotted path like 'a.b', got {list(paths)}")
        if not isinstance(self.require_all, bool):
            raise ValueError(f"task.metric_options.require_all: must be true or false, got {self.require_all!r}")
        object.__setattr__(self, "fields", paths)
        object.__setattr__(self, "binary", self.require_all or len(paths) == 1)

    def _paths(self, expected: Mapping[str, Any]) -> list[str]:
        paths = list(self.fields) or _leaf_paths(expected)
        if not paths:
            raise ValueError("no field to compare")
        return paths

    def score(self, output: str, reference: Any) -> float:
        expected = _reference_object(reference)
        paths = self._paths(expected)
        found = first_json_object(output)
        if found is None:
            return 0.0
        right = sum(_normal_value(_field_value(found, p)) == _normal_value(_field_value(expected, p)) for p in paths)
        if self.require_all:
            return float(right == len(paths))
        return right / len(paths)

    def _category(self, output: str, reference: Any, score: float) -> str | None:
        found = first_json_object(output)
        if found is None:
            return WRONG_FORMAT
        expected = _reference_object(reference)
        paths = self._paths(expected)
        if any(
            _field_value(found, p) is _MISSING and _normal_value(_field_value(expected, p)) is not None for p in paths
        ):
            return MISSING_FIELDS
        right = sum(_normal_value(_field_value(found, p)) == _normal_value(_field_value(expected, p)) for p in paths)
        return PARTIAL if right else WRONG_ANSWER


# -- regular expressions -----------------------------------------------------------------
_REFERENCE_SLOT = "{reference}"


@dataclass(frozen=True)
class RegexMatch(MetricBase):
    """1 when the output matches a regular expression, else 0.

    Without ``pattern`` the reference is the pattern. With it, ``{reference}`` in the pattern
    is replaced by the reference, escaped (matched literally). ``full_match``: the whole
    output must match (else a match anywhere); ``ignore_case``: case-insensitive.
    """

    pattern: str | None = None
    full_match: bool = False
    ignore_case: bool = False
    categories: Mapping[str, str] = field(default_factory=lambda: REGEX_CATEGORIES, hash=False, repr=False)
    name: str = field(default="regex", init=False)
    binary: bool = field(default=True, init=False)

    def __post_init__(self) -> None:
        if self.pattern is not None:
            if not isinstance(self.pattern, str) or not self.pattern:
                raise ValueError(f"task.metric_options.pattern: must be a non-empty pattern, got {self.pattern!r}")
            try:
                re.compile(self.pattern.replace(_REFERENCE_SLOT, "x"))
            except re.error as error:
                raise ValueError(
                    f"task.metric_options.pattern: not a valid regular expression ({error}); "
                    "write {reference} where the reference goes"
                ) from None
        for option in ("full_match", "ignore_case"):
            if not isinstance(getattr(self, option), bool):
                raise ValueError(f"task.metric_options.{option}: must be true or false, got {getattr(self, option)!r}")

    def score(self, output: str, reference: Any) -> float:
        flags = re.IGNORECASE if self.ignore_case else 0
        for answer in _answers(reference):
            if self.pattern is None:
                source = answer
            else:
                source = self.pattern.replace(_REFERENCE_SLOT, re.escape(answer))
            compiled = re.compile(source, flags)
            if (compiled.fullmatch(output) if self.full_match else compiled.search(output)) is not None:
                return 1.0
        return 0.0


# -- any Python callable -----------------------------------------------------------------
_PYTHON_PREFIX = "python:"
_PYTHON_FIX = (
    "write python:MODULE:FUNCTION, where MODULE imports (it is on PYTHONPATH) and FUNCTION "
    "takes (output, reference) and returns a number in [0, 1]"
)


def import_metric_function(spec: str) -> Callable[[str, Any], Any]:
    """The callable named by ``python:MODULE:FUNCTION`` (FUNCTION may be dotted: ``Class.method``).

    Raises ``ValueError`` naming ``task.metric`` and the fix when it cannot be imported.
    """
    parts = spec[len(_PYTHON_PREFIX) :].split(":") if spec.startswith(_PYTHON_PREFIX) else []
    if len(parts) != 2 or not all(parts):
        raise ValueError(f"task.metric: {spec!r} is not python:MODULE:FUNCTION; {_PYTHON_FIX}")
    module_name, attribute = parts
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as error:  # noqa: BLE001 - the user's module: any import failure is theirs to fix
        raise ValueError(
            f"task.metric: cannot import module {module_name!r} ({type(error).__name__}: {error}); {_PYTHON_FIX}"
        ) from None
    for name in attribute.split("."):
        if not hasattr(target, name):
            raise ValueError(f"task.metric: module {module_name!r} has no {attribute!r}; {_PYTHON_FIX}")
        target = getattr(target, name)
    if not callable(target):
        raise ValueError(f"task.metric: {module_name}:{attribute} is not callable; {_PYTHON_FIX}")
    function: Callable[[str, Any], Any] = target
    return function


@dataclass(frozen=True)
class CallableMetric(MetricBase):
    """Any Python callable ``(output, reference) -> float`` as a metric; ``binary`` if it answers 0 or 1 only."""

    function: Callable[[str, Any], Any]
    name: str = "python"
    binary: bool = False
    categories: Mapping[str, str] = field(default_factory=lambda: GRADED_CATEGORIES, hash=False, repr=False)

    def __post_init__(self) -> None:
        if not callable(self.function):
            raise ValueError("task.metric: the metric function is not callable")
        if not isinstance(self.binary, bool):
            raise ValueError(f"task.metric_options.binary: must be true or false, got {self.binary!r}")
        if self.binary and self.categories is GRADED_CATEGORIES:
            object.__setattr__(self, "categories", BINARY_CATEGORIES)

    def score(self, output: str, reference: Any) -> float:
        return float(self.function(output, reference))


# -- grades: the judge and TextGrad losses -----------------------------------------------
_GRADE_NUMBER = r"(\d+(?:\.\d+)?|\.\d+)"
_KEYWORD_GRADE = re.compile(
    r"\b(?:grade|score|rating)\b[\s*]*(?:[:=-]|is)?[\s*]*"
    + _GRADE_NUMBER
    + r"(?:\s*(?:/|out\s+of)\s*"
    + _GRADE_NUMBER
    + r")?\s*(%)?",
    re.IGNORECASE,
)
_FRACTION = re.compile(_GRADE_NUMBER + r"\s*(?:/|out\s+of)\s*" + _GRADE_NUMBER, re.IGNORECASE)
_BARE = re.compile(r"\s*\**\s*" + _GRADE_NUMBER + r"\s*(%)?\s*\**\s*\.?\s*")


def _grade_value(number: str, denominator: str | None, percent: str | None, scale: float) -> float | None:
    value = float(number)
    if denominator is not None:
        total = float(denominator)
        grade = value / total if total > 0 else math.nan
    elif percent:
        grade = value / 100.0
    elif "." in number and value <= 1.0:
        grade = value  # "0.8": a fraction already
    else:
        grade = value / scale  # "7": out of ``scale``
    return grade if 0.0 <= grade <= 1.0 else None


def parse_grade(text: str, *, scale: float = 10.0) -> float | None:
    """A grade in [0, 1] read from a judge's reply, or None when none parses.

    In this order: the last "Grade: N/M" (or "Score"/"Rating", "N out of M", "N%", a bare N);
    else the last "N/M" or "N out of M"; else a reply that is only a number. A bare integer
    is out of ``scale``; a decimal up to 1 is a fraction ("0.8"); a grade outside [0, 1] does
    not parse.
    """
    keyword = list(_KEYWORD_GRADE.finditer(text))
    if keyword:
        last = keyword[-1]
        return _grade_value(last.group(1), last.group(2), last.group(3), scale)
    fraction = list(_FRACTION.finditer(text))
    if fraction:
        last = fraction[-1]
        return _grade_value(last.group(1), last.group(2), None, scale)
    bare = _BARE.fullmatch(text)
    if bare:
        return _grade_value(bare.group(1), None, bare.group(2), scale)
    return None


_SLOT = re.compile(r"\{(output|reference|rubric)\}")


def _render(template: str, values: Mapping[str, str]) -> str:
    """``template`` with ``{output}``, ``{reference}`` and ``{rubric}`` filled in one pass
    (an output that holds "{reference}" is not filled again)."""
    return _SLOT.sub(lambda match: values.get(match.group(1), match.group(0)), template)


DEFAULT_RUBRIC = (
    "Grade how well the answer matches the reference answer: 10 when it says the same thing, "
    "0 when it is wrong or missing."
)
JUDGE_TEMPLATE = (
    "{rubric}\n\nReference answer:\n{reference}\n\nAnswer to grade:\n{output}\n\n"
    'End your reply with one line "Grade: N/10", N a whole number from 0 to 10.'
)
JUDGE_SYSTEM_PROMPT = "You are a strict, fair grader. You grade answers against a reference."


@dataclass(frozen=True)
class JudgeMetric(MetricBase):
    """An LLM judge: asks ``engine`` with the rubric, the reference and the output; parses the grade.

    ``max_tokens``: the judge's reply cap (public, fixed before any charge). A reply whose
    grade does not parse (``parse_grade``), or an engine that fails, scores 0. The prompt,
    the reply and the grade are private: nothing of them is logged or kept.
    """

    engine: Engine
    rubric: str = DEFAULT_RUBRIC
    max_tokens: int = 64
    template: str = JUDGE_TEMPLATE
    scale: float = 10.0
    categories: Mapping[str, str] = field(default_factory=lambda: GRADED_CATEGORIES, hash=False, repr=False)
    name: str = field(default="judge", init=False)
    binary: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(
                f"task.metric_options.max_tokens: the judge's reply cap must be >= 1, got {self.max_tokens!r}"
            )
        if "{output}" not in self.template:
            raise ValueError("task.metric_options.template: the judge's prompt must contain {output}")
        if not self.scale > 0:
            raise ValueError(f"task.metric_options.scale: must be > 0, got {self.scale!r}")

    def prompt(self, output: str, reference: Any) -> str:
        """The judge's prompt for one output (private: it holds the output and the reference)."""
        return _render(self.template, {"rubric": self.rubric, "reference": _as_text(reference), "output": output})

    def score(self, output: str, reference: Any) -> float:
        reply = self.engine.generate(
            self.prompt(output, reference),
            system_prompt=JUDGE_SYSTEM_PROMPT,
            temperature=0.0,
            max_tokens=self.max_tokens,
        )
        grade = parse_grade(reply, scale=self.scale)
        return 0.0 if grade is None else grade


TEXTGRAD_TEMPLATE = "Answer to evaluate:\n{output}\n\nReference answer:\n{reference}"


@dataclass(frozen=True)
class TextGradLossMetric(MetricBase):
    """A TextGrad loss module as a metric: its evaluation text is parsed into a grade (``parse_grade``).

    ``inputs="text"`` (for ``textgrad.loss.TextLoss``): the loss gets one ``Variable`` holding
    ``template`` with ``{output}`` and ``{reference}`` filled in. ``inputs="fields"`` (for
    ``MultiFieldEvaluation``): it gets ``[output, reference]`` as two Variables. The loss's
    instruction should ask for a grade such as "Grade: N/10"; one that does not parse scores 0.
    """

    loss: Callable[[Any], Any]
    inputs: Literal["text", "fields"] = "text"
    template: str = TEXTGRAD_TEMPLATE
    scale: float = 10.0
    categories: Mapping[str, str] = field(default_factory=lambda: GRADED_CATEGORIES, hash=False, repr=False)
    name: str = field(default="textgrad_loss", init=False)
    binary: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        if not callable(self.loss):
            raise ValueError("task.metric: the TextGrad loss must be callable (a textgrad.loss module)")
        if self.inputs not in ("text", "fields"):
            raise ValueError(f"task.metric_options.inputs: 'text' or 'fields', got {self.inputs!r}")
        if not self.scale > 0:
            raise ValueError(f"task.metric_options.scale: must be > 0, got {self.scale!r}")

    def score(self, output: str, reference: Any) -> float:
        from dp_textgrad._textgrad import import_textgrad

        variable = import_textgrad().Variable
        reference_text = _as_text(reference)
        if self.inputs == "fields":
            result = self.loss(
                [
                    variable(output, requires_grad=False, role_description="answer to evaluate"),
                    variable(reference_text, requires_grad=False, role_description="reference answer"),
                ]
            )
        else:
            text = _render(self.template, {"output": output, "reference": reference_text})
            result = self.loss(variable(text, requires_grad=False, role_description="answer to evaluate"))
        evaluation = getattr(result, "value", result)
        grade = parse_grade(evaluation if isinstance(evaluation, str) else str(evaluation), scale=self.scale)
        return 0.0 if grade is None else grade


# -- by name -----------------------------------------------------------------------------
_OPTIONS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "exact": (),
        "f1": (),
        "numeric": ("tolerance", "relative_tolerance"),
        "rouge_l": ("use_stemmer",),
        "json_fields": ("fields", "require_all"),
        "regex": ("pattern", "full_match", "ignore_case"),
        "python": ("binary",),
    }
)


def metric_from_name(
    name: str, options: Mapping[str, Any] | None = None, *, categories: Mapping[str, str] | None = None
) -> Metric:
    """The metric a run file names (``task.metric``), with its ``task.metric_options``.

    ``categories`` re-describes the metric's default failure categories (``task.categories``).
    Every check runs here, before any privacy budget is spent; a bad name or option is a
    ``ValueError`` naming the setting and what it accepts. ``judge`` is built with its engine
    (``JudgeMetric``), not by name.
    """
    if not isinstance(name, str):
        raise ValueError(f"task.metric: give a metric name, one of {', '.join(METRIC_NAMES)}")
    given = dict(options or {})
    key = "python" if name.startswith(_PYTHON_PREFIX) else name
    if key not in _OPTIONS:
        hint = " (the LLM judge needs a judge engine: build JudgeMetric(engine, rubric))" if name == "judge" else ""
        raise ValueError(f"task.metric: unknown metric {name!r}; accepted: {', '.join(METRIC_NAMES)}{hint}")
    unknown = sorted(str(option) for option in given if option not in _OPTIONS[key])
    if unknown:
        accepted = ", ".join(_OPTIONS[key]) or "none"
        raise ValueError(f"task.metric_options: unknown options {unknown} for metric {key!r}; accepted: {accepted}")
    metric: MetricBase
    if key == "exact":
        metric = ExactMatch(categories=_with_categories(EXACT_CATEGORIES, categories))
    elif key == "f1":
        metric = TokenF1(categories=_with_categories(F1_CATEGORIES, categories))
    elif key == "numeric":
        metric = NumericAnswer(**given, categories=_with_categories(NUMERIC_CATEGORIES, categories))
    elif key == "rouge_l":
        metric = RougeL(**given, categories=_with_categories(ROUGE_CATEGORIES, categories))
    elif key == "json_fields":
        if "fields" in given and (isinstance(given["fields"], str) or not isinstance(given["fields"], Sequence)):
            raise ValueError(f"task.metric_options.fields: give a list of dotted field paths, got {given['fields']!r}")
        fields = tuple(given.pop("fields", ()))
        metric = JsonFieldsMatch(fields=fields, **given, categories=_with_categories(JSON_CATEGORIES, categories))
    elif key == "regex":
        metric = RegexMatch(**given, categories=_with_categories(REGEX_CATEGORIES, categories))
    else:
        binary = given.get("binary", False)
        if not isinstance(binary, bool):
            raise ValueError(f"task.metric_options.binary: must be true or false, got {binary!r}")
        defaults = BINARY_CATEGORIES if binary else GRADED_CATEGORIES
        metric = CallableMetric(
            import_metric_function(name), name=name, binary=binary, categories=_with_categories(defaults, categories)
        )
    return metric


_JUDGE_OPTIONS = ("rubric", "max_tokens", "template", "scale")


def judge_from_options(
    engine: Engine, options: Mapping[str, Any] | None = None, *, categories: Mapping[str, str] | None = None
) -> JudgeMetric:
    """``task.metric: judge``: a :class:`JudgeMetric` asking ``engine`` (the run's engine), with
    ``task.metric_options`` (``rubric``, ``max_tokens``, ``template``, ``scale``) and
    ``task.categories`` re-describing its default categories; a bad option is a ``ValueError``."""
    given = dict(options or {})
    unknown = sorted(str(option) for option in given if option not in _JUDGE_OPTIONS)
    if unknown:
        raise ValueError(
            f"task.metric_options: unknown options {unknown} for metric 'judge'; accepted: {', '.join(_JUDGE_OPTIONS)}"
        )
    for key in ("rubric", "template"):
        if key in given and (not isinstance(given[key], str) or not given[key].strip()):
            raise ValueError(f"task.metric_options.{key}: must be non-empty text")
    return JudgeMetric(engine, **given, categories=_with_categories(GRADED_CATEGORIES, categories))
