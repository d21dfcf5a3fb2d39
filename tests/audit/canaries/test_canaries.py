"""Canaries: seeded generation, even insertion, inclusion mask, twin datasets, JSON files."""

from __future__ import annotations

import json
import re
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dp_textgrad.audit import (
    CanarySet,
    canaries_for_task,
    generate_canaries,
    inclusion_mask,
    insert_canaries,
    insertion_slots,
    load_canaries,
    opening_labels_from_examples,
    openings_from_examples,
    remove_canaries,
    save_canaries,
    twin_datasets,
    with_private_records,
)
from dp_textgrad.privacy.data import PrivateDataset
from dp_textgrad.tasks.base import ClassificationTask, Example

LABELS = ["billing", "technical", "account"]
FAST = settings(max_examples=25, deadline=None)
NO_LIMIT = {"warn_share": 1.0, "max_share": 1.0}  # spacing tests use dense insertions on purpose


def records(n: int) -> list[Example]:
    return [Example(f"record {i}: my bill is wrong", LABELS[i % 3]) for i in range(n)]


def small_task(n_private: int = 30, public: list[Example] | None = None) -> ClassificationTask:
    return ClassificationTask(
        name="t", description="route tickets", labels=list(LABELS),
        private_train=PrivateDataset(records(n_private)), test=[],
        public_examples=public if public is not None else [
            Example("Hello, my invoice is double. Please check it.", "billing"),
            Example("The router keeps rebooting! What now?", "technical"),
        ],
        record_template="Message: {text}\nCategory:", seed_prompt="Classify the message.",
    )


# -- generation -------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -1, -100, 1.5, True, "3"])
def test_non_positive_or_non_integer_count_is_a_clear_error(bad):
    with pytest.raises(ValueError, match="n: must be an integer >= 1"):
        generate_canaries(bad, seed=0, labels=LABELS)


@FAST
@given(n=st.integers(1, 500), seed=st.integers(0, 2**31 - 1))
def test_count_and_file_round_trip(n, seed):
    canary_set = generate_canaries(n, seed=seed, labels=LABELS, n_references=20)
    assert len(canary_set) == n
    assert len({c.canary_id for c in canary_set}) == n
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "canaries.json"
        save_canaries(path, canary_set)
        loaded = load_canaries(path)
    assert loaded == canary_set
    assert np.array_equal(loaded.included_mask, canary_set.included_mask)


@FAST
@given(n=st.integers(1, 60), seed=st.integers(0, 2**31 - 1))
def test_generation_is_determined_by_the_seed(n, seed):
    first = generate_canaries(n, seed=seed, labels=LABELS, n_references=30)
    again = generate_canaries(n, seed=seed, labels=LABELS, n_references=30)
    other = generate_canaries(n, seed=seed + 1, labels=LABELS, n_references=30)
    assert first == again
    assert [c.secret for c in first] != [c.secret for c in other]


@pytest.mark.parametrize("kind,pattern", [
    ("mixed", r"\d{6} [a-z]+ [a-z]+"),
    ("digits", r"\d{6}"),
    ("words", r"[a-z]+ [a-z]+"),
])
def test_secret_formats_and_universe(kind, pattern):
    canary_set = generate_canaries(200, seed=7, labels=LABELS, secret_kind=kind, n_references=300)
    secrets_ = [c.secret for c in canary_set]
    assert all(re.fullmatch(pattern, s) for s in secrets_)
    assert all(re.fullmatch(pattern, s) for s in canary_set.reference_secrets)
    assert len(set(secrets_)) == 200  # high-entropy: no repeats
    assert len(set(canary_set.reference_secrets)) == 300
    assert not set(secrets_) & set(canary_set.reference_secrets)  # references are never inserted


def test_canaries_look_like_task_records():
    task = small_task()
    canary_set = canaries_for_task(task, 40, seed=3, n_references=10)
    openings = openings_from_examples(task.public_examples)
    assert openings == ["Hello, my invoice is double.", "The router keeps rebooting!"]
    label_of = {"Hello, my invoice is double.": "billing", "The router keeps rebooting!": "technical"}
    assert opening_labels_from_examples(task.public_examples) == label_of
    for c in canary_set:
        assert c.label in task.labels
        opening = next(o for o in openings if c.prefix.startswith(o + " "))
        # in-distribution: the label of the public example whose opening the canary borrows
        assert c.label == label_of[opening]
        assert c.text == f"{c.prefix} {c.secret}."
        assert c.example == Example(c.text, c.label)
        assert c.continuation == " " + c.secret
    assert {c.label for c in canary_set} == {"billing", "technical"}
    # a canary text renders through the task like any record
    assert task.render_record(canary_set[0].text).startswith("Message: " + canary_set[0].prefix)


def test_prefixes_are_distinct_while_the_pool_lasts():
    canary_set = generate_canaries(128, seed=9, labels=LABELS, n_references=5)  # 8 openings x 16 stems
    assert len({c.prefix for c in canary_set}) == 128
    bigger = generate_canaries(300, seed=9, labels=LABELS, n_references=5)
    assert len({c.prefix for c in bigger}) == 128  # then reused, round by round


def test_generic_openings_when_the_task_has_no_public_examples():
    canary_set = canaries_for_task(small_task(public=[]), 5, seed=1, n_references=5)
    assert all(c.prefix for c in canary_set)
    # generic openings carry no label: it is drawn by seed, not fixed
    many = canaries_for_task(small_task(public=[]), 60, seed=1, n_references=5)
    assert len({c.label for c in many}) > 1
    assert many == generate_canaries(60, seed=1, labels=LABELS, n_references=5)


def test_an_opening_shared_by_different_labels_gets_random_labels():
    public = [
        Example("Hello there. My invoice is double.", "billing"),
        Example("Hello there. The router keeps rebooting!", "technical"),
        Example("I moved house. Please update my address.", "account"),
    ]
    assert opening_labels_from_examples(public) == {"I moved house.": "account"}
    canary_set = canaries_for_task(small_task(public=public), 60, seed=4, n_references=5)
    moved = [c for c in canary_set if c.prefix.startswith("I moved house. ")]
    shared = [c for c in canary_set if c.prefix.startswith("Hello there. ")]
    assert moved and shared
    assert {c.label for c in moved} == {"account"}
    assert len({c.label for c in shared}) > 1


@FAST
@given(n=st.integers(1, 60), seed=st.integers(0, 2**31 - 1))
def test_opening_labels_change_only_the_labels_of_their_openings(n, seed):
    openings = ["Hello, my invoice is double.", "The router keeps rebooting!", "Hi, a question."]
    fixed = {"Hello, my invoice is double.": "billing"}
    plain = generate_canaries(n, seed=seed, labels=LABELS, openings=openings, n_references=5)
    labelled = generate_canaries(n, seed=seed, labels=LABELS, openings=openings, opening_labels=fixed,
                                 n_references=5)
    assert labelled == generate_canaries(n, seed=seed, labels=LABELS, openings=openings, opening_labels=fixed,
                                         n_references=5)
    for a, b in zip(plain, labelled):
        assert (a.canary_id, a.prefix, a.secret, a.included) == (b.canary_id, b.prefix, b.secret, b.included)
        expected = "billing" if b.prefix.startswith("Hello, my invoice is double. ") else a.label
        assert b.label == expected
    assert plain.reference_secrets == labelled.reference_secrets


def test_opening_labels_must_be_task_labels():
    with pytest.raises(ValueError, match="opening_labels"):
        generate_canaries(3, seed=0, labels=LABELS, openings=["Hi."], opening_labels={"Hi.": "refund"})


def test_bad_seeds_are_clear_errors():
    with pytest.raises(ValueError, match="seed: must be an integer >= 0"):
        generate_canaries(3, seed=-1, labels=LABELS)
    with pytest.raises(ValueError, match="seed"):
        generate_canaries(3, seed=0, labels=LABELS, mask_seed=-5)


def test_too_many_references_for_the_secret_space_is_an_error():
    with pytest.raises(ValueError, match="n_references"):
        generate_canaries(10, seed=0, labels=LABELS, secret_kind="digits", n_references=600_000)


# -- inclusion mask ------------------------------------------------------------------------


def test_inclusion_mask_is_bernoulli_half_and_stored_with_its_seed():
    canary_set = generate_canaries(2000, seed=5, labels=LABELS, n_references=5, mask_seed=99)
    assert canary_set.mask_seed == 99
    assert np.array_equal(canary_set.included_mask, inclusion_mask(2000, 99))
    # 2000 fair coins: the share lies within 0.5 +- 0.05 except with probability < 1e-5
    assert 0.45 < canary_set.included_mask.mean() < 0.55
    # the mask does not depend on the generation seed, only on mask_seed
    other = generate_canaries(2000, seed=6, labels=LABELS, n_references=5, mask_seed=99)
    assert np.array_equal(other.included_mask, canary_set.included_mask)
    assert len(canary_set.members()) + len(canary_set.non_members()) == 2000


def test_default_mask_seed_is_the_generation_seed():
    canary_set = generate_canaries(50, seed=11, labels=LABELS, n_references=5)
    assert canary_set.mask_seed == 11
    assert np.array_equal(canary_set.included_mask, inclusion_mask(50, 11))


# -- insertion -------------------------------------------------------------------------------


@FAST
@given(n=st.integers(1, 500), interval=st.integers(1, 30), extra=st.integers(0, 499), seed=st.integers(0, 10**6))
def test_spacing_is_even(n, interval, extra, seed):
    n_records = n * interval + extra % n  # interval = n_records // n exactly
    canary_set = generate_canaries(n, seed=seed, labels=LABELS, n_references=5)
    insertion = insert_canaries(records(n_records), canary_set, **NO_LIMIT)
    assert insertion.interval == interval
    positions = np.array(insertion.positions)
    assert len(positions) == n
    assert positions[0] < interval  # starts within the first interval
    if n >= 2:
        gaps = np.diff(positions)
        average = len(insertion.records) / n
        assert gaps.max() <= 2 * average
        assert gaps.min() >= 0.5 * average


@FAST
@given(n=st.integers(1, 200), seed=st.integers(0, 10**6), extra=st.integers(0, 50))
def test_insertion_is_determined_by_the_seed(n, seed, extra):
    canary_set = generate_canaries(n, seed=seed, labels=LABELS, n_references=5)
    base = records(3 * n + extra)
    first = insert_canaries(base, canary_set, **NO_LIMIT)
    again = insert_canaries(base, canary_set, **NO_LIMIT)
    assert first == again
    assert insertion_slots(len(base), n, seed) == insertion_slots(len(base), n, seed)


@FAST
@given(n=st.integers(1, 100), seed=st.integers(0, 10**6), include=st.sampled_from(["all", "mask"]),
       extra=st.integers(0, 300))
def test_twin_datasets_are_identical_except_for_the_canaries(n, seed, include, extra):
    canary_set = generate_canaries(n, seed=seed, labels=LABELS, n_references=5)
    base = records(2 * n + extra)
    twins = twin_datasets(base, canary_set, include=include, **NO_LIMIT)
    inserted = twins.with_canaries
    assert list(twins.without_canaries) == base
    assert remove_canaries(inserted) == list(twins.without_canaries)  # record for record, in order
    expected = [c for c in canary_set if include == "all" or c.included]
    assert list(inserted.canary_ids) == [c.canary_id for c in expected]
    assert [inserted.records[p] for p in inserted.positions] == [c.example for c in expected]
    assert len(inserted.records) == len(base) + len(expected)


def test_mask_insertion_uses_the_same_slots_as_full_insertion():
    canary_set = generate_canaries(40, seed=2, labels=LABELS, n_references=5)
    base = records(6000)
    full = insert_canaries(base, canary_set)
    masked = insert_canaries(base, canary_set, include="mask")
    slots = insertion_slots(len(base), len(canary_set), canary_set.seed)
    # position of canary j in the full insertion = slot_j + j (j canaries before it)
    assert list(full.positions) == [s + j for j, s in enumerate(slots)]
    members = [j for j, c in enumerate(canary_set) if c.included]
    assert list(masked.positions) == [slots[j] + rank for rank, j in enumerate(members)]


def test_share_thresholds_warn_then_fail():
    canary_set = generate_canaries(9, seed=0, labels=LABELS, n_references=5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        insert_canaries(records(1200), canary_set)  # 9 / 1209 = 0.74%: silent
    with pytest.warns(UserWarning, match="canaries are 0.9"):
        insert_canaries(records(991), canary_set)  # 9 / 1000 = 0.9%
    with pytest.raises(ValueError, match="max_share"):
        insert_canaries(records(800), canary_set)  # 9 / 809 = 1.1%
    # thresholds are configurable
    insertion = insert_canaries(records(800), canary_set, warn_share=0.02, max_share=0.05)
    assert insertion.share == pytest.approx(9 / 809)


def test_too_few_records_is_an_error():
    canary_set = generate_canaries(10, seed=0, labels=LABELS, n_references=5)
    with pytest.raises(ValueError, match="at least 10 records"):
        insert_canaries(records(9), canary_set, **NO_LIMIT)


def test_twin_tasks_through_with_private_records():
    task = small_task()
    canary_set = canaries_for_task(task, 1, seed=0, n_references=5)
    base = records(200)
    twins = twin_datasets(base, canary_set)
    with_task = with_private_records(task, twins.with_canaries.records)
    without_task = with_private_records(task, twins.without_canaries)
    assert len(with_task.private_train) == 201 and len(without_task.private_train) == 200
    assert with_task.seed_prompt == task.seed_prompt and with_task.labels == task.labels


# -- files -----------------------------------------------------------------------------------


def test_loading_rejects_an_inconsistent_file(tmp_path):
    canary_set = generate_canaries(3, seed=0, labels=LABELS, n_references=5)
    payload = canary_set.to_dict()
    payload["reference_secrets"][0] = payload["canaries"][0]["secret"]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(payload))
    with pytest.raises(ValueError, match="reference_secrets"):
        load_canaries(path)
    payload = canary_set.to_dict()
    payload["canaries"][1]["canary_id"] = payload["canaries"][0]["canary_id"]
    with pytest.raises(ValueError, match="unique"):
        CanarySet.from_dict(payload)
    payload = canary_set.to_dict()
    payload["format"] = "something-else"
    with pytest.raises(ValueError):
        CanarySet.from_dict(payload)
