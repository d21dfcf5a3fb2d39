"""DP answers for a generation task's public inputs (dp.labelling on a generation task, issue 48):
the ledger is the plan, the candidates are public, each teacher sees its own records only, the
answers become the search's demonstrations, a resumed run reads them back, and the twin-run test
(D versus D plus one long record) finds no released byte that the record moves."""

from __future__ import annotations

import contextlib
import json
import re
import time
from pathlib import Path

import numpy as np
import pytest

import dp_textgrad
from dp_textgrad.dp_es.config import DPESConfig
from dp_textgrad.dp_es.plan import RunPlan
from dp_textgrad.engines.scripted import scripted_tokens
from dp_textgrad.privacy.accounting.serialize import event_to_dict
from dp_textgrad.privacy.token_voting import AnsweringPlan
from dp_textgrad.tasks.generation import GenerationExample
from tests.dp_es.test_generation_privacy import city_task
from tests.twin import GEN_CITIES, GEN_MARKER, LengthTimedGenerator, differences, generation_long_record, \
    generation_records, json_differences, run_generation_twin

POOL = [f"Parcel {i} was sent to {GEN_CITIES[i % 4]}" for i in range(6)]
LABELLING = {"teachers": 50, "queries": 4, "max_demos": 16, "sampling_rate": 0.5, "max_answer_tokens": 6}
SETTINGS = dict(epsilon=4.0, generations=2, population=3, parents=2, sampling_rate=0.5, insecure_noise_seed=3,
                seed=1, evaluate=False, labelling=LABELLING)


class TeacherGenerator(LengthTimedGenerator):
    """The twin engine, as a base model. As a teacher it votes on the public input alone: the city
    the input names, then the end marker; a teacher whose prompt shows the long record is slow (its
    time follows a private record, as a real model's does). Every prefix it scores is kept."""

    instruction_following = False

    def __init__(self) -> None:
        super().__init__()
        self.scored_prefixes: list[str] = []
        self.proposal_contexts: list[str] = []

    def score_choices_batch(self, prefix, suffixes, choices):
        if "Input:" not in prefix.rsplit("\n\n", 1)[-1]:
            return super().score_choices_batch(prefix, suffixes, choices)
        self.scored_prefixes.append(prefix)
        if GEN_MARKER in prefix:
            time.sleep(0.002)
        record = prefix.rsplit("Input:", 1)[-1]
        rows = []
        for answer in suffixes:
            match = re.search(r"to (\w+)", record)
            wanted = "\n\n" if answer.strip() or match is None else " " + match.group(1)
            rows.append([5.0 if choice == wanted else 0.0 for choice in choices])
        self._count(prompt_tokens=len(scripted_tokens(prefix)))  # the usage follows the teacher's records
        return np.asarray(rows)

    def top_next_pieces(self, prefix, suffix, k):
        self.proposal_contexts.append(prefix + suffix)
        return super().top_next_pieces(prefix, suffix, k)


def answers_task(n: int = 200, **overrides):
    return city_task(n=n, public_examples=[], public_inputs=list(POOL), **overrides)


def ledger_lines(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "ledger.jsonl").read_text().splitlines()[1:]]


def planned_atoms(run_dir: Path) -> list[dict]:
    config = DPESConfig(**json.loads((run_dir / "config.json").read_text(encoding="utf-8"))["config"])
    plan = RunPlan.with_value(config, json.loads((run_dir / "checkpoint.json").read_text())["plan_value"])
    answering = plan.labelling(0)
    assert isinstance(answering, AnsweringPlan)
    return [event_to_dict(event) for event in list(answering.events()) + plan.charges()]


@pytest.fixture(scope="module")
def answered(tmp_path_factory):
    root = tmp_path_factory.mktemp("answers")
    engine = TeacherGenerator()
    outcome = dp_textgrad.optimize(answers_task(), engine, runs_root=root, dataset_size=200, **SETTINGS)
    return outcome, engine, Path(outcome.run_dir)


# -- the plan, the ledger and the release ----------------------------------------------------------
def test_the_ledger_equals_the_plan_atom_for_atom_the_answers_first(answered) -> None:
    outcome, _, run_dir = answered
    lines = ledger_lines(run_dir)
    assert lines[0]["label"] == "labelling" and [line["label"] for line in lines].count("labelling") == 1
    assert [line["event"] for line in lines] == planned_atoms(run_dir)
    assert lines[0]["metadata"]["mechanism"] == "token_gnmax" and lines[0]["metadata"]["max_tokens"] == 6
    assert outcome.result.epsilon <= 4.0 + 1e-9


def test_the_answers_are_released_and_join_the_search_as_demonstrations(answered) -> None:
    outcome, _, run_dir = answered
    labels = json.loads((run_dir / "labels.json").read_text())
    assert labels["mechanism"] == "token_gnmax" and labels["inputs"] == POOL[:4]
    assert labels["queries"] == 4 and labels["teachers"] == 50 and labels["sampling_rate"] == 0.5
    answers = [e["reference"] for e in labels["examples"]]
    assert answers and all(isinstance(a, str) and a.strip() == a and a for a in answers)
    assert labels["answered"] == len(answers) == sum(v is not None for v in labels["labels"])
    # The unanimous vote wins at this noise for most inputs: the input's city.
    right = sum(e["reference"] == e["text"].rsplit(" ", 1)[-1] for e in labels["examples"])
    assert right >= 2, labels["examples"]
    demos = {(e.text, e.reference) for e in outcome.optimizer.task.public_examples}
    assert {(e["text"], e["reference"]) for e in labels["examples"]} <= demos


def test_the_candidates_are_public_and_each_teacher_sees_its_own_records(answered) -> None:
    _, engine, _ = answered
    private = [r.text for r in generation_records(200)]
    assert engine.proposal_contexts
    for context in engine.proposal_contexts:  # the public model: seed prompt, public input, released answer
        assert not any(text in context for text in private)
    # Each teacher prefix shows records of one group; two prefixes of one answer share none.
    shown = [{t for t in private if t in prefix} for prefix in set(engine.scored_prefixes)]
    assert any(shown)
    by_input: dict[str, list[set[str]]] = {}
    for prefix, records in zip(set(engine.scored_prefixes), shown):
        by_input.setdefault(prefix.rsplit("Input:", 1)[-1], []).append(records)
    for groups in by_input.values():
        seen: set[str] = set()
        for records in groups:
            assert not records & seen
            seen |= records


def test_a_resumed_run_reads_its_answers_back_and_never_answers_again(answered, tmp_path) -> None:
    from dp_textgrad.dp_es import labelling_phase
    from dp_textgrad.runs import RunDir

    _, _, run_dir = answered
    read = labelling_phase.read_labels(RunDir(run_dir))
    assert read is not None and read.examples
    assert all(isinstance(e, GenerationExample) and isinstance(e.reference, str) for e in read.examples)


class HoldingGenerator(TeacherGenerator):
    """Keeps prefixes as the local engine does: it records what the vote asks it to hold."""

    def __init__(self) -> None:
        super().__init__()
        self.holds: list[int] = []
        self.holding = 0
        self.teacher_calls_held: list[bool] = []

    @contextlib.contextmanager
    def hold_prefixes(self, count: int):
        self.holds.append(count)
        self.holding += 1
        try:
            yield
        finally:
            self.holding -= 1

    def score_choices_batch(self, prefix, suffixes, choices):
        if "Input:" in prefix.rsplit("\n\n", 1)[-1]:
            self.teacher_calls_held.append(self.holding > 0)
        return super().score_choices_batch(prefix, suffixes, choices)


def test_the_vote_asks_the_engine_to_hold_every_teacher_s_prefix(tmp_path) -> None:
    engine = HoldingGenerator()
    dp_textgrad.optimize(answers_task(), engine, runs_root=tmp_path, dataset_size=200, **SETTINGS)
    # Every teacher's prefix and the public proposal's, for the whole vote and only for it.
    assert engine.holds == [LABELLING["teachers"] + 1]
    assert engine.teacher_calls_held and all(engine.teacher_calls_held)
    assert engine.holding == 0


def test_an_answer_cut_at_a_stop_string_keeps_what_comes_before() -> None:
    from dp_textgrad.dp_es.dp_answers import TeacherAnswers

    task = answers_task()
    query = TeacherAnswers(LengthTimedGenerator(), task, POOL[0], [None], "", 4, True)
    assert query.extend(" Par", "is\n\nInput: x") == (" Paris", True)
    assert query.extend(" Par", "is") == (" Paris", False)
    candidates = query.candidates("")
    assert "\n\n" in candidates and " Paris" in candidates  # the end marker and the input's own tokens
    assert set(candidates) <= set(scripted_tokens(task.render_record(POOL[0]) + " " + POOL[0])) | {"\n", "\n\n"}


# -- the twin-run test -----------------------------------------------------------------------------
def twin_runs(tmp_path_factory, engine_factory, labelling) -> list:
    """The D and D + one long record runs of the answering phase (``labelling``), then the search."""
    records = generation_records(200)
    overrides = {"public_examples": [], "public_inputs": list(POOL)}
    settings = {**SETTINGS, "evaluate": False, "labelling": labelling}
    return [run_generation_twin(tmp_path_factory.mktemp(name), rows, settings, engine_factory=engine_factory,
                                coupled_extra_records=extra, task_overrides=overrides)
            for name, rows, extra in (("d", records, 0), ("dx", records + [generation_long_record(records)], 1))]


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    return twin_runs(tmp_path_factory, TeacherGenerator, LABELLING)


def test_both_twins_answer_first_and_finish(twins) -> None:
    for capture in twins:
        assert capture.exit_code == 0, capture.stdout + capture.stderr
        ledger = [json.loads(line) for line in capture.released["ledger.jsonl"].splitlines()[1:]]
        assert [entry["label"] for entry in ledger][:2] == ["dataset size: DP count", "labelling"]
        assert json.loads(capture.released["labels.json"])["answered"] >= 1


def test_no_released_byte_differs_between_the_twins(twins) -> None:
    d, dx = twins
    found = differences(d, dx)
    detail = {name: json_differences(d, dx, name) for name in found if name.endswith((".json", ".jsonl"))}
    assert not found, (found, detail)


def test_the_operator_area_sees_the_long_record_in_a_teacher(twins) -> None:
    d, dx = twins

    def teacher_tokens(capture) -> int:
        usage = json.loads(capture.operator["operator/labelling_usage.json"])
        return int(usage["prompt_tokens"])

    assert teacher_tokens(dx) > teacher_tokens(d)  # x was sampled and shown by its teacher


# -- synthetic demonstrations: the input generated too -------------------------------------------
TARGET = "Parcel 9 was sent to Oslo"


class SyntheticGenerator(LengthTimedGenerator):
    """As a public model it proposes the words of TARGET; as a teacher it spells TARGET as the
    input, then answers the input's city, then ends."""

    instruction_following = False

    def top_next_pieces(self, prefix, suffix, k):
        return [*scripted_tokens(" " + TARGET), " Rome", "\n\n"][:k]

    def score_choices_batch(self, prefix, suffixes, choices):
        if "Input:" not in prefix.rsplit("\n\n", 1)[-1]:
            return super().score_choices_batch(prefix, suffixes, choices)
        rows = []
        for written in suffixes:
            if prefix.endswith("Input: "):  # the input so far
                words = scripted_tokens(" " + TARGET)
                done = scripted_tokens(written)
                wanted = words[len(done)] if len(done) < len(words) else "\n"
            else:
                city = re.search(r"to (\w+)\nOutput:$", prefix)
                wanted = "\n\n" if written.strip() or city is None else " " + city.group(1)
            rows.append([5.0 if choice == wanted else 0.0 for choice in choices])
        return np.asarray(rows)


def test_synthetic_demonstrations_generate_the_input_then_the_answer(tmp_path) -> None:
    engine = SyntheticGenerator()
    labelling = {"teachers": 50, "synthetic_inputs": 3, "max_input_tokens": 8, "max_answer_tokens": 4,
                 "max_demos": 16, "sampling_rate": 0.5}
    task = city_task(n=200, public_examples=[], public_inputs=[])
    outcome = dp_textgrad.optimize(task, engine, runs_root=tmp_path, dataset_size=200,
                                   **{**SETTINGS, "labelling": labelling})
    run_dir = Path(outcome.run_dir)
    labels = json.loads((run_dir / "labels.json").read_text())
    assert labels["inputs"] == [] and labels["max_tokens"] == 12 and labels["max_input_tokens"] == 8
    assert len(labels["synthetic_inputs"]) == 3
    assert labels["synthetic_inputs"].count(TARGET) >= 2, labels
    assert {"text": TARGET, "reference": "Oslo"} in labels["examples"]
    lines = ledger_lines(run_dir)
    assert [line["event"] for line in lines] == planned_atoms(run_dir)


def test_synthetic_inputs_are_refused_beside_public_inputs_and_on_classification(tmp_path) -> None:
    from dp_textgrad.dp_es.config import ConfigError
    from tests.dp_es.test_labelling_phase import build, labelled_task

    with pytest.raises(ConfigError, match="synthetic_inputs: the task has public inputs"):
        dp_textgrad.optimize(answers_task(), SyntheticGenerator(), runs_root=tmp_path, dataset_size=200,
                             **{**SETTINGS, "labelling": {"synthetic_inputs": 2}})
    with pytest.raises(ConfigError, match="dp.labelling.synthetic_inputs: applies to generation tasks"):
        build(labelled_task(), labelling={"teachers": 6, "synthetic_inputs": 2})


def test_the_report_shows_the_answers_as_dp_outputs(answered) -> None:
    from dp_textgrad.report.markdown import labelled_demonstrations

    _, _, run_dir = answered
    result = json.loads((run_dir / "result.json").read_text())
    text = "\n".join(labelled_demonstrations(result))
    assert "## DP-answered demonstrations" in text and "GNMax per token over public candidates" in text
    assert "the answers are DP outputs" in text
    for example in result["labelling"]["examples"]:
        assert f"| {example['reference']} |" in text


def test_the_answer_filters_are_public_rules_on_released_answers() -> None:
    from dp_textgrad.dp_es.dp_answers import kept_answer

    text = "Parcel 3 was sent to Rome"
    assert kept_answer("junk", text, False, "none")
    assert not kept_answer("Rome", text, False, "ended") and kept_answer("junk", text, True, "ended")
    assert kept_answer("Rome", text, True, "span") and kept_answer("sent to Rome", text, True, "span")
    assert not kept_answer("Oslo", text, True, "span") and not kept_answer("Rome", text, False, "span")
    assert not kept_answer(" ", text, True, "span")  # no letter or digit
    with pytest.raises(ValueError, match="answer_filter"):
        kept_answer("Rome", text, True, "strict")


def test_a_span_filtered_run_releases_only_answers_found_in_their_inputs(tmp_path) -> None:
    engine = TeacherGenerator()
    labelling = {**LABELLING, "answer_filter": "span"}
    outcome = dp_textgrad.optimize(answers_task(), engine, runs_root=tmp_path, dataset_size=200,
                                   **{**SETTINGS, "labelling": labelling})
    labels = json.loads((Path(outcome.run_dir) / "labels.json").read_text())
    assert labels["answer_filter"] == "span" and labels["examples"]
    for example in labels["examples"]:
        assert example["reference"] in example["text"]
    assert all(v is None or v in t for v, t in zip(labels["labels"], labels["inputs"]))


# -- the span vote: one vote per answer over the public input's spans ----------------------------
SPAN_LABELLING = {**LABELLING, "vote": "span"}


class SpanGenerator(TeacherGenerator):
    """As a teacher (a prompt ending in a public pool input) it writes the city the input names,
    or ``wrong`` when set; a teacher whose prompt shows the long record is slow and its usage grows
    (as a real model's would). Every teacher prefix it generates after is kept."""

    def __init__(self, wrong: str | None = None, fail: bool = False) -> None:
        super().__init__()
        self.wrong, self.fail = wrong, fail
        self.generated_prefixes: list[str] = []

    def generate_after_prefix(self, prefix, suffixes, *, max_tokens, stop=None, temperature=0.0):
        if len(suffixes) == 1 and "Parcel" in suffixes[0]:
            self.generated_prefixes.append(prefix)
            if self.fail:
                raise RuntimeError(f"teacher failed on {prefix!r}")  # the text quotes private records
            if GEN_MARKER in prefix:
                time.sleep(0.002)
            self._count(prompt_tokens=len(scripted_tokens(prefix)))
            city = re.search(r"to (\w+)", suffixes[0])
            return [" " + (self.wrong or (city.group(1) if city else "none")) + "\n"]
        return super().generate_after_prefix(prefix, suffixes, max_tokens=max_tokens, stop=stop,
                                             temperature=temperature)


def test_the_span_candidates_are_the_inputs_spans_up_to_the_cap() -> None:
    from dp_textgrad.dp_es.dp_answers import NO_SPAN, input_spans

    spans = input_spans([" Sent", " to", " Paris", ",", " 75", "001"], 2)
    assert spans[-1] == NO_SPAN and len(spans) == len(set(spans))
    assert {"Sent", "Sent to", "to Paris", "Paris", "Paris,", "75", "75001", ", 75"} <= set(spans)
    assert "to Paris," not in spans and "," not in spans  # over the cap; no letter or digit
    assert input_spans([], 3) == [NO_SPAN]


@pytest.fixture(scope="module")
def span_answered(tmp_path_factory):
    root = tmp_path_factory.mktemp("span")
    engine = SpanGenerator()
    outcome = dp_textgrad.optimize(answers_task(), engine, runs_root=root, dataset_size=200,
                                   **{**SETTINGS, "labelling": SPAN_LABELLING})
    return outcome, engine, Path(outcome.run_dir)


def test_a_span_vote_charges_one_step_per_answer_and_the_ledger_is_the_plan(span_answered, answered) -> None:
    outcome, _, run_dir = span_answered
    lines = ledger_lines(run_dir)
    assert lines[0]["label"] == "labelling"
    assert [line["event"] for line in lines] == planned_atoms(run_dir)
    meta = lines[0]["metadata"]
    assert meta["mechanism"] == "token_gnmax" and meta["max_tokens"] == 1
    labels = json.loads((run_dir / "labels.json").read_text())
    assert labels["vote"] == "span" and labels["max_answer_tokens"] == 6 and "candidates" not in labels
    # The same share and queries: one step per answer needs far less noise than 6 token steps.
    token_labels = json.loads((answered[2] / "labels.json").read_text())
    assert token_labels["max_tokens"] == 6 and labels["sigma"] < token_labels["sigma"] / 2
    assert outcome.result.epsilon <= 4.0 + 1e-9


def test_a_span_vote_releases_spans_of_the_inputs_and_they_join_the_search(span_answered) -> None:
    outcome, engine, run_dir = span_answered
    labels = json.loads((run_dir / "labels.json").read_text())
    assert labels["examples"] and labels["answered"] == len(labels["examples"])
    for example in labels["examples"]:
        assert example["reference"] in example["text"]
    right = sum(e["reference"] == e["text"].rsplit(" ", 1)[-1] for e in labels["examples"])
    assert right >= 3, labels["examples"]
    demos = {(e.text, e.reference) for e in outcome.optimizer.task.public_examples}
    assert {(e["text"], e["reference"]) for e in labels["examples"]} <= demos
    # Each teacher generates alone after a prefix of its own group's records.
    private = [r.text for r in generation_records(200)]
    assert engine.generated_prefixes and not engine.proposal_contexts
    assert any(any(t in prefix for t in private) for prefix in engine.generated_prefixes)


def test_the_report_names_the_span_vote(span_answered) -> None:
    from dp_textgrad.report.markdown import labelled_demonstrations

    _, _, run_dir = span_answered
    result = json.loads((run_dir / "result.json").read_text())
    text = "\n".join(labelled_demonstrations(result))
    assert "GNMax over the public input's spans (at most 6 tokens)" in text
    assert "each by one vote over the input's spans" in text


def test_when_no_teacher_answers_a_span_the_vote_releases_no_demonstration(tmp_path) -> None:
    labelling = {**SPAN_LABELLING, "epsilon_share": 0.9}
    for engine in (SpanGenerator(wrong="Atlantis"), SpanGenerator(fail=True)):
        outcome = dp_textgrad.optimize(answers_task(), engine, runs_root=tmp_path / str(engine.fail),
                                       dataset_size=200, **{**SETTINGS, "labelling": labelling})
        run_dir = Path(outcome.run_dir)
        labels = json.loads((run_dir / "labels.json").read_text())
        released = (run_dir / "labels.json").read_text() + (run_dir / "result.json").read_text()
        assert "teacher failed" not in released and "Atlantis" not in released
        assert [line["event"] for line in ledger_lines(run_dir)] == planned_atoms(run_dir)
        # Every teacher votes "no span" (a failed call too): the noise rarely lifts a span over 50 votes.
        assert labels["answered"] <= 1, labels["examples"]


def test_a_span_vote_refuses_the_token_votes_keys_and_classification(tmp_path) -> None:
    from dp_textgrad.dp_es.config import ConfigError, LabellingConfig
    from tests.dp_es.test_labelling_phase import build, labelled_task

    for key, value in (("candidates", 8), ("copy_input", False), ("synthetic_inputs", 2)):
        with pytest.raises(ValueError, match=f"dp.labelling.{key}: applies to the token vote"):
            LabellingConfig(vote="span", **{key: value}).resolved(6, 200, generation_tokens=8)
    assert LabellingConfig(vote="span").resolved(6, 200, generation_tokens=8).answer_steps == 1
    with pytest.raises(ConfigError, match="dp.labelling.vote: applies to generation tasks"):
        build(labelled_task(), labelling={"teachers": 6, "vote": "span"})


@pytest.fixture(scope="module")
def span_twins(tmp_path_factory):
    return twin_runs(tmp_path_factory, SpanGenerator, SPAN_LABELLING)


def test_no_released_byte_differs_between_the_span_vote_twins(span_twins) -> None:
    d, dx = span_twins
    for capture in span_twins:
        assert capture.exit_code == 0, capture.stdout + capture.stderr
        assert json.loads(capture.released["labels.json"])["vote"] == "span"
    found = differences(d, dx)
    detail = {name: json_differences(d, dx, name) for name in found if name.endswith((".json", ".jsonl"))}
    assert not found, (found, detail)
    usage = [int(json.loads(c.operator["operator/labelling_usage.json"])["prompt_tokens"]) for c in span_twins]
    assert usage[1] > usage[0]  # the long record was sampled and shown by its teacher
