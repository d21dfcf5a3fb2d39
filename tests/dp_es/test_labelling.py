"""The teachers of the DP labelling step (dp_textgrad.dp_es.labelling): one scoring call per
teacher with its own group as demonstrations, fixed public rules (demonstrations, context,
failures), the charge before the first engine call, and the released labels."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dp_textgrad.dp_es.labelling import (
    DPLabelled,
    compose_prompt,
    dp_labels,
    load_unlabelled,
    prefix_token_cap,
    teacher_demos,
    teacher_prompt,
    teacher_votes,
)
from dp_textgrad.engines.base import EngineError
from dp_textgrad.engines.scripted import ScriptedEngine
from dp_textgrad.privacy.accounting import PrivacyLedger, event_to_dict
from dp_textgrad.privacy.data import PrivateBatch, PrivateDataset
from dp_textgrad.privacy.noise import NoiseSource
from dp_textgrad.privacy.voting import (
    GNMax,
    LabellingPlan,
    partition_teachers,
    plan_labelling,
    teacher_of,
    vote_histograms,
)
from dp_textgrad.tasks.base import ClassificationTask, Example
from tests.helpers import ZeroNoise

KEY = b"labelling-test-key-0123456789abc"
LABELS = ["negative", "positive"]
PUBLIC = ["a good film", "a bad film", "good acting", "bad plot and bad acting"]
FAST = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def make_task(records: Sequence[Example]) -> ClassificationTask:
    return ClassificationTask(
        name="toy",
        description="Toy reviews.",
        labels=list(LABELS),
        private_train=PrivateDataset(list(records)),
        test=[Example("good", "positive"), Example("bad", "negative")],
        seed_prompt="Read the review.",
    )


def reviews(n: int, seed: int = 0) -> list[Example]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        good = bool(rng.random() < 0.5)
        out.append(Example(f"{'good' if good else 'bad'} movie number {i}", "positive" if good else "negative"))
    return out


def nearest_demo(context: str, choices: Sequence[str]) -> list[float]:
    """A toy teacher: the label of the demonstration sharing most words with the input (first wins)."""
    blocks = context.split("\n\n")
    query = set(blocks[-1].removeprefix("Text: ").removesuffix("\nLabel:").split())
    best, best_overlap = None, -1
    for block in blocks[:-1]:
        match = re.fullmatch(r"Text: (.*)\nLabel: (\w+)", block, flags=re.S)
        if match:
            overlap = len(query & set(match.group(1).split()))
            if overlap > best_overlap:
                best, best_overlap = match.group(2), overlap
    return [4.0 if best is not None and choice.strip() == best else 0.0 for choice in choices]


class RecordingEngine(ScriptedEngine):
    """A scripted engine that records each scoring call; ``fail_if`` (a substring of the prefix)
    makes it raise an error quoting the prefix, as a careless engine might."""

    def __init__(
        self,
        *,
        fail_if: str | None = None,
        nan_if: str | None = None,
        context: int | None = None,
        events: list | None = None,
    ) -> None:
        super().__init__(choice_rule=nearest_demo, max_context_tokens=context)
        self.calls: list[tuple[str, tuple[str, ...], tuple[str, ...]]] = []
        self.fail_if, self.nan_if = fail_if, nan_if
        self.events = events if events is not None else []

    def score_choices_batch(self, prefix, suffixes, choices):
        self.calls.append((prefix, tuple(suffixes), tuple(choices)))
        self.events.append("engine")
        if self.fail_if is not None and self.fail_if in prefix:
            raise EngineError(f"the engine choked on: {prefix}")
        scores = super().score_choices_batch(prefix, suffixes, choices)
        if self.nan_if is not None and self.nan_if in prefix:
            scores[0, 0] = np.nan
        return scores


class SpyLedger(PrivacyLedger):
    def __init__(self, events: list) -> None:
        super().__init__(50.0, 1e-5)
        self.events_seen = events

    def spend(self, event, label, metadata=None):
        self.events_seen.append("charge")
        return super().spend(event, label, metadata)


def plan_for(teachers: int, queries: int = len(PUBLIC), sigma: float = 1.0) -> LabellingPlan:
    return LabellingPlan(GNMax(sigma, len(LABELS)), queries=queries, teachers=teachers)


def group_texts(group: PrivateBatch[Example]) -> set[str]:
    return {rec.unwrap().text for rec in group}


# -- teachers ---------------------------------------------------------------------------------------


def test_a_teachers_prompt_holds_only_its_own_groups_records_spread_over_labels() -> None:
    records = reviews(60)
    task = make_task(records)
    partition = partition_teachers(task.private_train, KEY, 5)
    every_text = {r.text for r in records}
    for group in partition.groups():
        text = teacher_prompt(task, group, "Read the review.", 4, key=KEY)
        assert text is not None and text.startswith("Read the review.\n\n")
        shown = {t for t in every_text if f"Text: {t}\n" in text}
        assert shown and shown <= group_texts(group)  # nothing of another group
        demos = teacher_demos(task, group, 4, KEY)
        assert len(demos) == 4 and {d.label for d in demos} == set(LABELS)  # spread over the labels
        assert text == compose_prompt(task, "Read the review.", demos)
        # A function of the group as a set: the group's order does not matter.
        assert teacher_demos(task, PrivateBatch(list(reversed(group.records))), 4, KEY) == demos
    assert teacher_prompt(task, PrivateBatch([]), "Read the review.", 4, key=KEY) is None


def test_a_prompt_over_the_cap_drops_demonstrations_from_the_end_or_abstains() -> None:
    records = reviews(8)
    task = make_task(records)
    group = PrivateBatch(list(task.private_train))
    count = ScriptedEngine().count_tokens
    full = teacher_demos(task, group, 4, KEY)
    sizes = [count(task.render_prefix(compose_prompt(task, "Go.", full[:k]))) for k in range(1, 5)]
    assert teacher_prompt(
        task, group, "Go.", 4, key=KEY, count_tokens=count, max_prefix_tokens=sizes[3]
    ) == compose_prompt(task, "Go.", full)
    assert teacher_prompt(
        task, group, "Go.", 4, key=KEY, count_tokens=count, max_prefix_tokens=sizes[3] - 1
    ) == compose_prompt(task, "Go.", full[:3])
    assert teacher_prompt(
        task, group, "Go.", 4, key=KEY, count_tokens=count, max_prefix_tokens=sizes[0]
    ) == compose_prompt(task, "Go.", full[:1])
    assert teacher_prompt(task, group, "Go.", 4, key=KEY, count_tokens=count, max_prefix_tokens=sizes[0] - 1) is None


def test_the_cap_is_public_and_a_prompt_with_no_room_is_refused_before_any_charge() -> None:
    task = make_task(reviews(10))
    engine = RecordingEngine(context=64)
    cap = prefix_token_cap(engine, task, PUBLIC, "Read the review.")
    longest = max(engine.count_tokens(task.render_record(x)) for x in PUBLIC)
    assert cap == 64 - longest - 2 - 1
    assert prefix_token_cap(RecordingEngine(), task, PUBLIC, "x") is None  # no known context
    ledger = PrivacyLedger(50.0, 1e-5)
    with pytest.raises(ValueError, match="leave no room"):
        dp_labels(task, engine, PUBLIC, plan_for(3), ledger, ZeroNoise(), KEY, prompt="word " * 60)
    assert ledger.entries == [] and engine.calls == []


def test_votes_per_teacher_come_from_one_call_with_that_teachers_prefix() -> None:
    task = make_task(reviews(80))
    engine = RecordingEngine()
    partition = partition_teachers(task.private_train, KEY, 6)
    vote = teacher_votes(engine, task, partition, PUBLIC, "Read the review.", 4, key=KEY)
    for group in partition.groups():
        before = len(engine.calls)
        votes = vote(group)
        assert len(engine.calls) == before + 1
        prefix, suffixes, choices = engine.calls[-1]
        assert prefix == task.render_prefix(teacher_prompt(task, group, "Read the review.", 4, key=KEY))
        assert suffixes == tuple(task.render_record(x) for x in PUBLIC)
        assert choices == (" negative", " positive")
        expected = np.argmax(engine.score_choices_batch(prefix, list(suffixes), list(choices)), axis=1)
        assert votes == [int(i) for i in expected]


@FAST
@given(
    st.lists(
        st.tuples(st.sampled_from(["good", "bad", "fine", "dull"]), st.integers(0, 40), st.sampled_from(LABELS)),
        min_size=1,
        max_size=40,
    ),
    st.tuples(st.sampled_from(["good", "bad", "fine", "dull"]), st.integers(0, 40), st.sampled_from(LABELS)),
    st.integers(1, 12),
    st.integers(0, 40),
    st.integers(1, 4),
)
def test_one_record_more_changes_one_teachers_prompt_and_votes_at_most(rows, extra, teachers, where, demos) -> None:
    def example(row):
        return Example(f"{row[0]} film {row[1]}", row[2])

    records = [example(r) for r in rows]
    bigger = records[: where % (len(records) + 1)] + [example(extra)] + records[where % (len(records) + 1) :]
    engine = RecordingEngine(context=24)  # a tight context (room for 2 demonstrations): the fit rule is tested too
    results = []
    for data in (records, bigger):
        task = make_task(data)
        partition = partition_teachers(task.private_train, KEY, teachers)
        cap = prefix_token_cap(engine, task, PUBLIC, "Go.")
        count = engine.count_tokens
        prompts = [
            teacher_prompt(task, g, "Go.", demos, key=KEY, count_tokens=count, max_prefix_tokens=cap)
            for g in partition.groups()
        ]
        vote = teacher_votes(engine, task, partition, PUBLIC, "Go.", demos, key=KEY, max_prefix_tokens=cap)
        votes = [vote(g) for g in partition.groups()]
        every = [teacher_prompt(task, g, "Go.", 100, key=KEY) for g in partition.groups()]  # all records shown
        results.append((prompts, votes, every))
    (prompts_a, votes_a, every_a), (prompts_b, votes_b, every_b) = results
    home = teacher_of(example(extra), KEY, teachers)
    assert [t for t in range(teachers) if every_a[t] != every_b[t]] == [home]  # exactly the record's teacher
    assert [t for t in range(teachers) if prompts_a[t] != prompts_b[t]] in ([], [home])
    changed = [t for t in range(teachers) if votes_a[t] != votes_b[t]]
    assert len(changed) <= 1
    assert all(prompts_a[t] != prompts_b[t] for t in changed)  # only a teacher whose prompt changed
    hist_a = vote_histograms(votes_a, 2, len(PUBLIC))
    hist_b = vote_histograms(votes_b, 2, len(PUBLIC))
    assert np.all(np.sqrt(((hist_a - hist_b) ** 2).sum(axis=1)) <= np.sqrt(2) + 1e-12)


# -- failures ---------------------------------------------------------------------------------------


def test_a_failing_teacher_abstains_and_its_error_text_appears_nowhere(capsys, caplog) -> None:
    records = reviews(40)
    secret = "zebra-secret-4711"
    records[7] = Example(f"good movie {secret}", "positive")
    task = make_task(records)
    partition = partition_teachers(task.private_train, KEY, 5)
    failing = [t for t, g in enumerate(partition.groups()) if secret in " ".join(group_texts(g))]
    assert len(failing) == 1
    # max_demos large enough that the secret record is among the failing teacher's demonstrations.
    engine = RecordingEngine(fail_if=secret)
    vote = teacher_votes(engine, task, partition, PUBLIC, "Go.", 40, key=KEY)
    votes = [vote(g) for g in partition.groups()]
    assert votes[failing[0]] == [None] * len(PUBLIC)
    groups = list(partition.groups())
    assert all(v != [None] * len(PUBLIC) for t, v in enumerate(votes) if t != failing[0] and len(groups[t]))

    ledger = PrivacyLedger(50.0, 1e-5)
    result = dp_labels(
        task, RecordingEngine(fail_if=secret), PUBLIC, plan_for(5), ledger, ZeroNoise(), KEY, prompt="Go.", max_demos=40
    )
    expected = np.argmax(vote_histograms(votes, 2, len(PUBLIC)), axis=1)
    assert list(result.labels) == [LABELS[i] for i in expected]
    captured = capsys.readouterr()
    texts = [
        repr(result),
        json.dumps(result.metadata),
        json.dumps([e.to_dict() for e in ledger.entries]),
        captured.out,
        captured.err,
        caplog.text,
    ]
    assert not any(secret in text for text in texts)


def test_non_finite_scores_or_a_wrong_shape_make_the_teacher_abstain() -> None:
    task = make_task(reviews(30))
    partition = partition_teachers(task.private_train, KEY, 1)
    group = next(partition.groups())
    vote = teacher_votes(RecordingEngine(nan_if="Text:"), task, partition, PUBLIC, "Go.", 4, key=KEY)
    assert vote(group) == [None] * len(PUBLIC)

    class Short(RecordingEngine):
        def score_choices_batch(self, prefix, suffixes, choices):
            return super().score_choices_batch(prefix, suffixes, choices)[:1]

    vote = teacher_votes(Short(), task, partition, PUBLIC, "Go.", 4, key=KEY)
    assert vote(group) == [None] * len(PUBLIC)


# -- the labelling step -----------------------------------------------------------------------------


def test_the_charge_precedes_the_first_engine_call_and_equals_the_plan() -> None:
    events: list[str] = []
    task = make_task(reviews(50))
    engine = RecordingEngine(events=events)
    ledger = SpyLedger(events)
    plan = plan_labelling(2.0, 1e-5, queries=len(PUBLIC), teachers=7, num_labels=2)
    result = dp_labels(task, engine, PUBLIC, plan, ledger, NoiseSource(insecure_seed=1), KEY)
    assert events[0] == "charge" and events.count("charge") == 1
    assert events.count("engine") == 7  # one call per teacher (every group holds records here)
    assert [event_to_dict(e.event) for e in ledger.entries] == [event_to_dict(e) for e in plan.events()]
    entry = ledger.entries[0]
    assert entry.label == "labelling"
    assert entry.metadata["queries"] == len(PUBLIC) and entry.metadata["teachers"] == 7
    assert isinstance(result, DPLabelled) and result.queries == len(PUBLIC)
    assert result.metadata["mechanism"] == "gnmax" and result.metadata["sigma"] == plan.mechanism.sigma
    assert result.metadata["answered"] == result.answered == len(result.examples) == len(PUBLIC)


def test_an_unaffordable_labelling_calls_no_engine() -> None:
    events: list[str] = []
    engine = RecordingEngine(events=events)
    ledger = PrivacyLedger(0.1, 1e-5)
    from dp_textgrad.privacy.accounting.ledger import BudgetExceeded

    with pytest.raises(BudgetExceeded):
        dp_labels(make_task(reviews(20)), engine, PUBLIC, plan_for(3), ledger, ZeroNoise(), KEY)
    assert engine.calls == [] and ledger.entries == []


def test_with_a_huge_margin_the_labels_are_the_teachers_majority() -> None:
    task = make_task(reviews(400, seed=3))
    plan = plan_labelling(4.0, 1e-5, queries=len(PUBLIC), teachers=80, num_labels=2)
    assert plan.mechanism.sigma < 4  # 80 agreeing teachers: a margin of many sigmas
    engine = RecordingEngine()
    partition = partition_teachers(task.private_train, KEY, 80)
    vote = teacher_votes(engine, task, partition, PUBLIC, task.seed_prompt, 4, key=KEY)
    histogram = vote_histograms([vote(g) for g in partition.groups()], 2, len(PUBLIC))
    majority = [LABELS[i] for i in histogram.argmax(axis=1)]
    assert majority == ["positive", "negative", "positive", "negative"]
    assert np.all(np.abs(histogram[:, 0] - histogram[:, 1]) > 10 * plan.mechanism.sigma)
    for seed in range(5):
        result = dp_labels(task, engine, PUBLIC, plan, PrivacyLedger(50.0, 1e-5), NoiseSource(insecure_seed=seed), KEY)
        assert list(result.labels) == majority
        assert [e.text for e in result.examples] == PUBLIC and [e.label for e in result.examples] == majority


def test_confident_gnmax_leaves_the_unanswered_inputs_out() -> None:
    task = make_task(reviews(40))
    plan = plan_labelling(
        8.0, 1e-5, queries=len(PUBLIC), teachers=4, num_labels=2, threshold=1000.0, threshold_sigma=5.0
    )
    result = dp_labels(task, RecordingEngine(), PUBLIC, plan, PrivacyLedger(50.0, 1e-5), ZeroNoise(), KEY)
    assert result.labels == (None,) * len(PUBLIC) and result.examples == () and result.answered == 0
    assert result.metadata["mechanism"] == "confident_gnmax"


def test_a_plan_that_does_not_match_the_task_or_the_inputs_is_refused() -> None:
    task = make_task(reviews(10))
    with pytest.raises(ValueError, match="planned for 3"):
        dp_labels(task, RecordingEngine(), PUBLIC, plan_for(2, queries=3), PrivacyLedger(9.0, 1e-5), ZeroNoise(), KEY)
    plan = LabellingPlan(GNMax(1.0, 3), queries=len(PUBLIC), teachers=2)
    with pytest.raises(ValueError, match="3 labels"):
        dp_labels(task, RecordingEngine(), PUBLIC, plan, PrivacyLedger(9.0, 1e-5), ZeroNoise(), KEY)
    with pytest.raises(ValueError, match="every public input"):
        dp_labels(
            task, RecordingEngine(), ["ok", " "], plan_for(2, queries=2), PrivacyLedger(9.0, 1e-5), ZeroNoise(), KEY
        )


# -- public unlabelled inputs -----------------------------------------------------------------------


def test_load_unlabelled_reads_txt_jsonl_csv_and_tsv(tmp_path) -> None:
    (tmp_path / "a.txt").write_text("first input\n\n  second input  \n", encoding="utf-8")
    assert load_unlabelled(tmp_path / "a.txt") == ["first input", "second input"]
    (tmp_path / "a.jsonl").write_text('{"text": "one", "id": 1}\n{"text": "two"}\n', encoding="utf-8")
    assert load_unlabelled(tmp_path / "a.jsonl") == ["one", "two"]
    (tmp_path / "a.csv").write_text('id,sentence\n1,"hello, world"\n2,bye\n', encoding="utf-8")
    assert load_unlabelled(tmp_path / "a.csv", column="sentence") == ["hello, world", "bye"]
    (tmp_path / "a.tsv").write_text("text\tlabel\nfine film\t1\n", encoding="utf-8")
    assert load_unlabelled(tmp_path / "a.tsv") == ["fine film"]
    with pytest.raises(ValueError, match="column 'missing' not found"):
        load_unlabelled(tmp_path / "a.csv", column="missing")
    with pytest.raises(ValueError, match="no columns"):
        load_unlabelled(tmp_path / "a.txt", column="text")


@pytest.mark.parametrize("name,content", [("e.txt", "\n  \n"), ("e.jsonl", ""), ("e.csv", ""), ("e.tsv", "text\n")])
def test_an_empty_pool_is_refused_naming_the_file(tmp_path, name, content) -> None:
    (tmp_path / name).write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape(name)):
        load_unlabelled(tmp_path / name)


def test_an_unknown_extension_or_missing_file_is_refused(tmp_path) -> None:
    (tmp_path / "a.md").write_text("x\n", encoding="utf-8")
    with pytest.raises(ValueError, match="a.md"):
        load_unlabelled(tmp_path / "a.md")
    with pytest.raises(FileNotFoundError):
        load_unlabelled(tmp_path / "none.txt")


# -- the local model ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_teachers_on_the_local_model_label_support_messages(llama_engine) -> None:
    from dp_textgrad.tasks.registry import get_task

    task = get_task("support", n_private=60, n_public=8, n_test=4)
    inputs = [example.text for example in task.test[:4]]
    plan = plan_labelling(2.0, 1e-5, queries=len(inputs), teachers=6, num_labels=len(task.labels))
    ledger = PrivacyLedger(4.0, 1e-5)
    decoded_before = llama_engine.kv_stats.tokens_decoded
    start = time.perf_counter()
    result = dp_labels(task, llama_engine, inputs, plan, ledger, NoiseSource(insecure_seed=0), KEY, max_demos=3)
    elapsed = time.perf_counter() - start
    assert elapsed < 30
    assert result.answered == len(inputs) and all(label in task.labels for label in result.labels)
    assert [e.text for e in result.examples] == inputs
    assert len(ledger.entries) == 1 and ledger.entries[0].metadata["teachers"] == 6
    assert llama_engine.kv_stats.tokens_decoded > decoded_before  # the teachers really scored
