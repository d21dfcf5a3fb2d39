"""Metrics for generation tasks: scores, grades, safe scoring, failure categories, building by name."""

from __future__ import annotations

import logging
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dp_textgrad.engines.scripted import ScriptedEngine
from dp_textgrad.tasks.metrics import (
    METRIC_NAMES,
    CallableMetric,
    ExactMatch,
    JsonFieldsMatch,
    JudgeMetric,
    Metric,
    NumericAnswer,
    RegexMatch,
    RougeL,
    TextGradLossMetric,
    TokenF1,
    first_json_object,
    last_number,
    metric_from_name,
    normalize_answer,
    parse_grade,
    safe_score,
)
from tests.subprocess_driver import run_driver

SECRET = "Jane Roe, account 4417-1234"


# -- normalisation, exact match, F1 (SQuAD) ---------------------------------------------
@pytest.mark.parametrize(
    ("text", "normal"),
    [
        ("The Denver Broncos!", "denver broncos"),
        ("  Santa   Clara, California ", "santa clara california"),
        ("an apple a day", "apple day"),
        ("Théâtre", "théâtre"),  # only ASCII punctuation goes, as in SQuAD's script
        ("A", ""),
    ],
)
def test_squad_normalisation(text: str, normal: str) -> None:
    assert normalize_answer(text) == normal


def test_exact_match_normalises_and_takes_the_best_of_several_answers() -> None:
    metric = ExactMatch()
    assert metric.score("The Denver Broncos.", "Denver Broncos") == 1.0
    assert metric.score("Denver", "Denver Broncos") == 0.0
    assert metric.score("Carolina Panthers", ["Denver Broncos", "the Carolina Panthers"]) == 1.0
    assert metric.binary and metric.name == "exact"


def test_token_f1_is_squads() -> None:
    metric = TokenF1()
    # SQuAD's own example style: one extra word, P = 2/3, R = 1.
    assert metric.score("Denver Broncos team", "The Denver Broncos") == pytest.approx(0.8)
    assert metric.score("Panthers", "Carolina Panthers") == pytest.approx(2 * 1 * 0.5 / 1.5)
    assert metric.score("nothing shared", "Denver Broncos") == 0.0
    assert metric.score("the", "a") == 1.0  # both normalise to nothing: a match (SQuAD 2.0)
    assert metric.score("Broncos", ["Panthers", "Denver Broncos"]) == pytest.approx(2 / 3)
    assert not metric.binary


# -- numeric final answers (GSM8K) ------------------------------------------------------
GSM8K_REFERENCE = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"
)


def test_numeric_reads_the_last_number_and_the_gsm8k_answer() -> None:
    metric = NumericAnswer()
    assert metric.score("She sold 48 then 24, so 72 clips in all.", GSM8K_REFERENCE) == 1.0
    assert metric.score("72 clips? No: 48 + 24 = 73.", GSM8K_REFERENCE) == 0.0
    assert metric.score("The total is $1,234.00", "#### 1,234") == 1.0
    assert metric.score("#### 1234", "Sum is 1,000 + 234 = 1,234\n#### 1,234") == 1.0
    assert metric.score("It costs -5 dollars", "#### -5") == 1.0
    assert metric.score("ages 3-4", 4) == 1.0  # a hyphen after a digit is no minus sign
    assert metric.score("about 0.5", 0.5000001) == 1.0  # within the default tolerance
    assert metric.score("no number here", "#### 3") == 0.0
    assert NumericAnswer(relative_tolerance=0.01).score("99.5", "#### 100") == 1.0


def test_last_number() -> None:
    assert last_number("a 1,234.5 b $7.") == 7.0
    assert last_number("x .25") == 0.25
    assert last_number("none") is None


def test_numeric_reference_without_a_number_raises_and_scores_zero_safely() -> None:
    metric = NumericAnswer()
    with pytest.raises(ValueError):
        metric.score("4", "no answer")
    assert safe_score(metric, "4", "no answer") == 0.0


# -- ROUGE-L ------------------------------------------------------------------------------
def test_rouge_l_f_measure() -> None:
    metric = RougeL()
    # LCS "the cat on the mat": 5 of 6 words each side.
    assert metric.score("the cat was on the mat", "The cat sat on the mat") == pytest.approx(5 / 6)
    assert metric.score("The cat sat on the mat.", "the cat sat on the mat") == 1.0
    assert metric.score("dogs", "the cat") == 0.0
    assert RougeL(use_stemmer=True).score("cats running", "cat runs") == 1.0
    assert RougeL(use_stemmer=False).score("cats running", "cat runs") == 0.0


def test_building_rouge_l_leaves_the_applications_logging_alone() -> None:
    # rouge-score logs "Using default tokenizer." through absl when it picks its tokenizer;
    # with no handler on the root logger that call installs one (logging.basicConfig), and
    # every later warning of any library would reach stderr.
    body = (
        "before = list(logging.getLogger().handlers)\n"
        "metric = RougeL()\n"
        "assert metric.score('the cat sat', 'the cat sat') == 1.0\n"
        "print(before == logging.getLogger().handlers)\n"
    )
    run = run_driver("import logging\nfrom dp_textgrad.tasks.metrics import RougeL", body)
    assert run.stdout.strip() == "True"


# -- JSON fields --------------------------------------------------------------------------
NESTED_REFERENCE = {"customer": {"name": "Jane Roe", "address": {"city": "Leeds"}}, "amount": 1234, "items": ["a", "b"]}


def test_json_fields_nested_paths_fences_and_normalisation() -> None:
    metric = JsonFieldsMatch(fields=("customer.name", "customer.address.city", "amount", "items"))
    output = (
        "Here it is:\n```json\n"
        '{"customer": {"name": "jane roe.", "address": {"city": "LEEDS"}}, "amount": "1,234", "items": ["b", "a"]}\n'
        "```"
    )
    assert metric.score(output, NESTED_REFERENCE) == 1.0
    wrong_city = '{"customer": {"name": "Jane Roe", "address": {"city": "York"}}, "amount": 1234}'
    assert metric.score(wrong_city, NESTED_REFERENCE) == pytest.approx(0.5)  # name and amount right
    assert metric.score("no json at all", NESTED_REFERENCE) == 0.0
    assert metric.score('{"customer": ', NESTED_REFERENCE) == 0.0  # broken JSON
    assert metric.score('[1, 2] then {"amount": 1234}', NESTED_REFERENCE) == pytest.approx(0.25)
    # The reference may itself be JSON text; without fields every leaf of the reference counts.
    assert JsonFieldsMatch().score('{"a": 1, "b": {"c": "x"}}', '{"a": 1, "b": {"c": "y"}}') == pytest.approx(0.5)
    assert JsonFieldsMatch(fields=("a",), require_all=True).binary
    strict = JsonFieldsMatch(fields=("a", "b"), require_all=True)
    assert strict.score('{"a": 1, "b": 3}', {"a": 1, "b": 2}) == 0.0
    assert strict.score('{"a": 1, "b": null}', {"a": 1}) == 1.0  # null equals missing


def test_first_json_object() -> None:
    assert first_json_object('text {"a": {"b": 1}} more {"c": 2}') == {"a": {"b": 1}}
    assert first_json_object('```\n{"x": 1}\n``` and {"y": 2}') == {"x": 1}
    assert first_json_object("{not json} {also not}") is None


# -- regular expressions -------------------------------------------------------------------
def test_regex_reference_as_pattern_and_pattern_option() -> None:
    assert RegexMatch().score("Order 12345 shipped", r"\b\d{5}\b") == 1.0
    assert RegexMatch().score("Order 1234 shipped", r"\b\d{5}\b") == 0.0
    templated = RegexMatch(pattern=r"^Answer:\s*{reference}\.?$", ignore_case=True)
    assert templated.score("answer:  3.5", "3.5") == 1.0
    assert templated.score("Answer: 3x5", "3.5") == 0.0  # the reference is matched literally
    assert RegexMatch(full_match=True).score("yes indeed", "yes") == 0.0
    assert RegexMatch().score("yes indeed", "yes") == 1.0


# -- any Python callable -----------------------------------------------------------------
def test_python_metric_is_imported_when_built() -> None:
    metric = metric_from_name("python:operator:eq", {"binary": True})
    assert metric.name == "python:operator:eq" and metric.binary
    assert metric.score("a", "a") == 1.0 and metric.score("a", "b") == 0.0
    assert set(metric.categories) == {"correct", "empty", "too_long", "error", "wrong_answer"}


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("python:no_such_module_for_dp_textgrad:f", "cannot import module"),
        ("python:operator:no_such_function", "has no"),
        ("python:math:pi", "is not callable"),
        ("python:operator", "is not python:MODULE:FUNCTION"),
    ],
)
def test_python_metric_bad_paths_are_clear_errors(name: str, says: str) -> None:
    with pytest.raises(ValueError, match="task.metric") as raised:
        metric_from_name(name)
    assert says in str(raised.value) and "python:MODULE:FUNCTION" in str(raised.value)


# -- safe_score ---------------------------------------------------------------------------
def _raises(output: str, reference: Any) -> float:
    raise RuntimeError(f"failed on {output}")


def test_safe_score_turns_failures_into_zero_silently(caplog: pytest.LogCaptureFixture, capsys: Any) -> None:
    caplog.set_level(logging.DEBUG)
    assert safe_score(CallableMetric(_raises), SECRET, SECRET) == 0.0
    assert safe_score(CallableMetric(lambda o, r: math.nan), SECRET, SECRET) == 0.0
    assert safe_score(CallableMetric(lambda o, r: math.inf), SECRET, SECRET) == 0.0
    assert safe_score(CallableMetric(lambda o, r: 1.5), SECRET, SECRET) == 0.0
    assert safe_score(CallableMetric(lambda o, r: -0.1), SECRET, SECRET) == 0.0
    assert safe_score(CallableMetric(lambda o, r: "not a number"), SECRET, SECRET) == 0.0
    assert safe_score(CallableMetric(lambda o, r: 0.25), SECRET, SECRET) == 0.25
    captured = capsys.readouterr()
    assert not caplog.records and SECRET not in captured.out + captured.err


# -- grades, the judge, TextGrad losses ----------------------------------------------------
@pytest.mark.parametrize(
    ("reply", "grade"),
    [
        ("Grade: 7/10", 0.7),
        ("The answer misses the date.\nGrade: 4 / 10", 0.4),
        ("score: 0.8", 0.8),
        ("Rating is 4 out of 5", 0.8),
        ("**Grade:** 9", 0.9),
        ("Final score - 8", 0.8),
        ("Grade is 3 out of 4", 0.75),
        ("7", 0.7),
        ("0.8", 0.8),
        ("80%", 0.8),
        ("I'd say 3/5.", 0.6),
        ("Grade: 2/10 at first, but on reflection Grade: 10/10", 1.0),
        ("Grade: 11/10", None),
        ("Grade: 5/0", None),
        ("good answer", None),
        ("", None),
        ("The answer mentions 7 items", None),
    ],
)
def test_parse_grade(reply: str, grade: float | None) -> None:
    parsed = parse_grade(reply)
    assert parsed == (None if grade is None else pytest.approx(grade))


def test_judge_asks_the_engine_with_the_rubric_and_parses_the_grade() -> None:
    engine = ScriptedEngine(["The date is missing.\nGrade: 7/10", "I cannot grade this."])
    judge = JudgeMetric(engine, rubric="Is the refund amount right?", max_tokens=32)
    assert judge.score("Refund 40 GBP", "Refund of 40 GBP on 3 May") == pytest.approx(0.7)
    [call] = engine.history
    assert "Is the refund amount right?" in call.prompt
    assert "Refund 40 GBP" in call.prompt and "Refund of 40 GBP on 3 May" in call.prompt
    assert call.max_tokens == 32 and call.temperature == 0.0
    assert judge.score("x", "y") == 0.0  # a grade that does not parse scores 0
    assert not judge.binary and judge.name == "judge"


def test_judge_prompt_fills_each_slot_once() -> None:
    judge = JudgeMetric(ScriptedEngine(["Grade: 1/10"]))
    prompt = judge.prompt("my {reference} text", "REF")
    assert "my {reference} text" in prompt and prompt.count("REF") == 1


def test_judge_engine_failure_scores_zero() -> None:
    engine = ScriptedEngine(["Grade: 9/10"], cycle=False)
    judge = JudgeMetric(engine)
    assert safe_score(judge, "a", "b") == 0.9
    assert safe_score(judge, "a", "b") == 0.0  # the engine raises EngineError: 0, no exception


class StubLoss:
    """A TextGrad loss module stand-in: records what it was given, answers a fixed evaluation."""

    def __init__(self, evaluation: str) -> None:
        self.evaluation = evaluation
        self.seen: list[Any] = []

    def __call__(self, instance: Any) -> Any:
        self.seen.append(instance)

        class Result:
            value = self.evaluation

        return Result()


def test_textgrad_loss_adapter_text_and_fields() -> None:
    loss = StubLoss("The answer is close. Grade: 8/10")
    metric = TextGradLossMetric(loss)
    assert metric.score("Paris", "Paris, France") == pytest.approx(0.8)
    [variable] = loss.seen
    assert "Paris" in variable.value and "Paris, France" in variable.value and not variable.requires_grad
    fields = StubLoss("score: 0.25")
    assert TextGradLossMetric(fields, inputs="fields").score("a", {"k": 1}) == pytest.approx(0.25)
    [[output, reference]] = fields.seen
    assert output.value == "a" and reference.value == '{"k": 1}'
    assert TextGradLossMetric(StubLoss("no grade given")).score("a", "b") == 0.0


def test_textgrad_text_loss_with_a_scripted_engine() -> None:
    from dp_textgrad._textgrad import import_textgrad

    textgrad = import_textgrad()
    engine = ScriptedEngine(["Reasoning.\nGrade: 6/10"])
    loss = textgrad.loss.TextLoss("Grade the answer against the reference; end with 'Grade: N/10'.", engine=engine)
    assert TextGradLossMetric(loss).score("42", "#### 42") == pytest.approx(0.6)
    assert "42" in engine.history[0].prompt


# -- failure categories ---------------------------------------------------------------------
def test_categories_of_each_metric() -> None:
    exact = ExactMatch()
    assert exact.categorise("   ", "Denver", False) == "empty"
    assert exact.categorise("Denver", "denver", True) == "correct"
    assert exact.categorise("It was Denver Broncos", "Denver Broncos", False) == "extra_text"
    assert exact.categorise("Denver Nuggets", "Denver Broncos", False) == "partial"
    assert exact.categorise("Carolina", "Denver Broncos", False) == "wrong_answer"
    assert exact.categorise("Carolina and on and on", "Denver", True) == "too_long"

    numeric = NumericAnswer()
    assert numeric.categorise("seventy-two", GSM8K_REFERENCE, False) == "wrong_format"
    assert numeric.categorise("73", GSM8K_REFERENCE, False) == "wrong_answer"
    assert numeric.categorise("so 72", GSM8K_REFERENCE, False) == "correct"

    rouge = RougeL()
    assert rouge.categorise("the cat was on the mat", "the cat sat on the mat", False) == "partial"
    assert rouge.categorise("a cat in a hat with a bat and a rat", "the cat sat", False) == "low_overlap"
    assert rouge.categorise("dogs", "the cat", False) == "wrong_answer"

    json_metric = JsonFieldsMatch(fields=("a", "b"))
    assert json_metric.categorise("sure!", {"a": 1, "b": 2}, False) == "wrong_format"
    assert json_metric.categorise('{"a": 1}', {"a": 1, "b": 2}, False) == "missing_fields"
    assert json_metric.categorise('{"a": 1, "b": 3}', {"a": 1, "b": 2}, False) == "partial"
    assert json_metric.categorise('{"a": 0, "b": 3}', {"a": 1, "b": 2}, False) == "wrong_answer"

    judge = JudgeMetric(ScriptedEngine(["Grade: 5/10"]))
    assert judge.categorise("anything", "ref", False, score=0.5) == "partial"
    assert judge.categorise("anything", "ref", False, score=math.nan) == "wrong_answer"
    assert not judge.engine.history  # the score given is used: the judge is not asked again

    assert CallableMetric(_raises).categorise("x", "y", False) == "wrong_answer"


def test_every_category_has_a_one_line_description() -> None:
    metrics = [metric_from_name(name) for name in ("exact", "f1", "numeric", "rouge_l", "json_fields", "regex")]
    for metric in metrics:
        assert {"correct", "empty", "too_long", "wrong_answer"} <= set(metric.categories)
        assert all(text and "\n" not in text for text in metric.categories.values())


# -- by name ---------------------------------------------------------------------------------
def test_metric_from_name_builds_each_metric_with_its_options() -> None:
    assert isinstance(metric_from_name("exact"), ExactMatch)
    assert isinstance(metric_from_name("f1"), TokenF1)
    assert metric_from_name("numeric", {"tolerance": 0.5}).score("2.4", 2) == 1.0
    assert isinstance(metric_from_name("rouge_l", {"use_stemmer": False}), RougeL)
    json_metric = metric_from_name("json_fields", {"fields": ["a.b"], "require_all": True})
    assert json_metric.score('{"a": {"b": "x"}}', {"a": {"b": "X"}}) == 1.0
    assert metric_from_name("regex", {"pattern": "^{reference}$"}).score("a.b", "a.b") == 1.0
    for name in ("exact", "f1", "numeric", "rouge_l", "json_fields", "regex", "python:operator:eq"):
        assert isinstance(metric_from_name(name), Metric)
    assert "python:MODULE:FUNCTION" in METRIC_NAMES


@pytest.mark.parametrize(
    ("name", "options", "setting", "says"),
    [
        ("bleu", None, "task.metric:", "accepted: exact, f1"),
        ("judge", None, "task.metric:", "JudgeMetric"),
        ("exact", {"tolerance": 1}, "task.metric_options:", "accepted: none"),
        ("numeric", {"tol": 1}, "task.metric_options:", "accepted: tolerance, relative_tolerance"),
        ("numeric", {"tolerance": -1}, "task.metric_options.tolerance", ">= 0"),
        ("json_fields", {"fields": "a.b"}, "task.metric_options.fields", "list of dotted"),
        ("json_fields", {"fields": ["a..b"]}, "task.metric_options.fields", "dotted path"),
        ("regex", {"pattern": "(unclosed"}, "task.metric_options.pattern", "not a valid regular expression"),
        ("rouge_l", {"use_stemmer": "yes"}, "task.metric_options.use_stemmer", "true or false"),
        ("python:operator:eq", {"binary": 1}, "task.metric_options.binary", "true or false"),
    ],
)
def test_metric_from_name_rejects_bad_names_and_options(
    name: str, options: dict[str, Any] | None, setting: str, says: str
) -> None:
    with pytest.raises(ValueError, match=setting.replace(".", r"\.")) as raised:
        metric_from_name(name, options)
    assert says in str(raised.value)


def test_categories_option_re_describes_the_defaults_only() -> None:
    metric = metric_from_name("numeric", categories={"wrong_format": "no digits in the reply"})
    assert metric.categories["wrong_format"] == "no digits in the reply"
    assert list(metric.categories) == list(NumericAnswer().categories)
    with pytest.raises(ValueError, match=r"task\.categories: unknown categories \['hallucinated'\]"):
        metric_from_name("numeric", categories={"hallucinated": "made something up"})
    with pytest.raises(ValueError, match=r"task\.categories\.empty"):
        metric_from_name("exact", categories={"empty": ""})


# -- properties -------------------------------------------------------------------------------
# Built once: RougeL loads nltk's stemmer.
BUILT_IN: list[Metric] = [
    ExactMatch(),
    TokenF1(),
    NumericAnswer(),
    RougeL(),
    JsonFieldsMatch(fields=("a", "b.c")),
    RegexMatch(pattern=r"(?i)answer:\s*{reference}"),
]
TEXT = st.text(max_size=60) | st.sampled_from(["", " ", "#### 12", '{"a": 1, "b": {"c": "x"}}', "answer: 3", "the a"])
JSON_REFERENCE = st.fixed_dictionaries(
    {"a": st.integers(-5, 5) | st.text(max_size=5), "b": st.fixed_dictionaries({"c": st.text(max_size=5)})}
)


def _reference_for(metric: Metric, text: str, number: int, document: dict[str, Any]) -> Any:
    if isinstance(metric, NumericAnswer):
        return f"#### {number:,}"
    if isinstance(metric, JsonFieldsMatch):
        return document
    return text


@settings(max_examples=150, deadline=None)
@given(output=TEXT, reference=TEXT, number=st.integers(-(10**6), 10**6), document=JSON_REFERENCE)
def test_every_built_in_score_is_in_the_unit_interval(
    output: str, reference: str, number: int, document: dict[str, Any]
) -> None:
    for metric in BUILT_IN:
        value = metric.score(output, _reference_for(metric, reference, number, document))
        assert 0.0 <= value <= 1.0, metric.name


@settings(max_examples=150, deadline=None)
@given(text=TEXT)
def test_exact_and_f1_give_one_on_the_reference_itself(text: str) -> None:
    assert ExactMatch().score(text, text) == 1.0
    assert TokenF1().score(text, text) == 1.0


@settings(max_examples=150, deadline=None)
@given(output=TEXT, reference=TEXT, hit=st.booleans(), number=st.integers(-(10**6), 10**6), document=JSON_REFERENCE)
def test_categorise_names_one_of_the_metrics_categories(
    output: str, reference: str, hit: bool, number: int, document: dict[str, Any]
) -> None:
    for metric in BUILT_IN:
        category = metric.categorise(output, _reference_for(metric, reference, number, document), hit)
        assert category in metric.categories, metric.name
