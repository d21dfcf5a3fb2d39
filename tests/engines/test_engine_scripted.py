"""ScriptedEngine: deterministic behaviour that other modules' tests rely on."""

from __future__ import annotations

import numpy as np
import pytest

from dp_textgrad.engines.base import EngineError
from dp_textgrad.engines.scripted import ScriptedEngine, scripted_tokens


def test_list_script_answers_in_order_and_cycles() -> None:
    engine = ScriptedEngine(["first", "second"])
    assert [engine.generate("p") for _ in range(3)] == ["first", "second", "first"]


def test_list_script_without_cycle_raises_when_exhausted() -> None:
    engine = ScriptedEngine(["only"], cycle=False)
    assert engine.generate("p") == "only"
    with pytest.raises(EngineError, match="exhausted after 1"):
        engine.generate("p")


def test_mapping_script_picks_first_matching_keyword_then_default() -> None:
    engine = ScriptedEngine({"rewrite": "Rewritten prompt.", "critique": "A critique."}, default="fallback")
    assert engine.generate("Please critique this") == "A critique."
    assert engine.generate("rewrite after the critique") == "Rewritten prompt."  # mapping order wins
    assert engine.generate("something else") == "fallback"
    with pytest.raises(EngineError, match="no scripted response"):
        ScriptedEngine({"a": "b"}).generate("zzz")


def test_callable_script_sees_prompt_and_system_prompt() -> None:
    engine = ScriptedEngine(lambda prompt, system: f"{system}|{prompt.upper()}")
    assert engine.generate("hi", system_prompt="sys") == "sys|HI"
    assert engine("hi") == "None|HI"


def test_default_answer_is_a_deterministic_function_of_the_prompt() -> None:
    engine = ScriptedEngine()
    assert engine.generate("a") == ScriptedEngine().generate("a")
    assert engine.generate("a") != engine.generate("b")


def test_stop_and_max_tokens_truncate() -> None:
    engine = ScriptedEngine(["one two three. four five"])
    assert engine.generate("p", stop=["."]) == "one two three"
    assert engine.generate("p", max_tokens=2) == "one two"
    with pytest.raises(ValueError, match="max_tokens"):
        engine.generate("p", max_tokens=0)


def test_history_records_calls() -> None:
    engine = ScriptedEngine(["x"])
    engine.generate("prompt text", system_prompt="sys", temperature=0.7, seed=3, stop=["\n"])
    call = engine.history[-1]
    assert (call.prompt, call.system_prompt, call.temperature, call.seed, call.stop) == (
        "prompt text", "sys", 0.7, 3, ("\n",))


def test_usage_counts_words_as_tokens() -> None:
    engine = ScriptedEngine(["a b c"])
    engine.generate("one two", system_prompt="three")
    engine.score_choices_batch("p q", ["r", "s t"], [" x", " y"])
    engine.token_logprobs("u v", context="w")
    usage = engine.usage
    assert usage.calls == 3
    assert usage.completion_tokens == 3
    assert usage.prompt_tokens == 3 + (2 + 1 + 2) + (1 + 2)


def test_keyword_rule_last_keyword_in_context_wins() -> None:
    engine = ScriptedEngine(choice_rule={"great": "positive", "awful": "negative"}, rule_strength=3.0)
    prompt = "Examples: great -> positive, awful -> negative.\n"
    scores = engine.score_choices_batch(prompt, ["Text: an awful film", "Text: a GREAT film", "Text: a film"],
                                        [" positive", " negative"])
    probs = np.exp(scores)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0)
    assert scores[0].argmax() == 1 and scores[1].argmax() == 0
    # No keyword in the record: the prompt's last keyword ("awful") decides.
    assert scores[2].argmax() == 1
    np.testing.assert_allclose(scores[0], [-np.log1p(np.exp(3.0)), 3.0 - np.log1p(np.exp(3.0))])


def test_callable_rule_is_log_softmaxed_and_validated() -> None:
    engine = ScriptedEngine(choice_rule=lambda context, choices: [len(context) % 3, 0.0, 1.0])
    row = engine.score_choices("abcd", ["a", "b", "c"])  # len 4 -> logits [1, 0, 1]
    np.testing.assert_allclose(row, np.array([1.0, 0.0, 1.0]) - np.log(2 * np.e + 1))
    bad = ScriptedEngine(choice_rule=lambda context, choices: [0.0])
    with pytest.raises(EngineError, match="one finite logit per choice"):
        bad.score_choices("x", ["a", "b"])


def test_scores_depend_only_on_the_full_context() -> None:
    engine = ScriptedEngine()
    batch = engine.score_choices_batch("The prefix. ", ["one", "two"], ["a", "b", "c"])
    np.testing.assert_allclose(batch[1], engine.score_choices("The prefix. two", ["a", "b", "c"]))
    np.testing.assert_allclose(np.logaddexp.reduce(batch, axis=1), 0.0, atol=1e-12)
    with pytest.raises(ValueError, match="choices"):
        engine.score_choices("x", [])


def test_token_logprobs_are_deterministic_and_context_dependent() -> None:
    engine = ScriptedEngine()
    a = engine.token_logprobs(" the cat sat", context="Story:")
    b = ScriptedEngine().token_logprobs(" the cat sat", context="Story:")
    c = engine.token_logprobs(" the cat sat", context="Poem:")
    assert a.tokens == [" the", " cat", " sat"] == scripted_tokens(" the cat sat")
    np.testing.assert_array_equal(a.logprobs, b.logprobs)
    assert not np.array_equal(a.logprobs, c.logprobs)
    assert np.all((a.logprobs < 0) & (a.logprobs > -8.1))
    assert all(len(alts) == 5 for alts in a.top_alternatives)


def test_context_window_is_simulated() -> None:
    engine = ScriptedEngine(["ok"], max_context_tokens=5)
    assert engine.generate("one two three") == "ok"
    with pytest.raises(EngineError, match="holds 5"):
        engine.generate("one two three four five six")
    with pytest.raises(EngineError):
        engine.score_choices_batch("one two three", [" four five"], [" six"])
    with pytest.raises(EngineError):
        engine.token_logprobs(" four five six", context="one two three")


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"responses": "a single string"}, TypeError),
        ({"responses": []}, ValueError),
        ({"rule_strength": float("nan")}, ValueError),
        ({"max_context_tokens": 0}, ValueError),
    ],
)
def test_invalid_arguments_are_rejected(kwargs: dict, error: type[Exception]) -> None:
    with pytest.raises(error):
        ScriptedEngine(**kwargs)
