"""Tasks scored by the caller's pipeline (``tasks.scored``): the bridge the DSPy and GEPA integrations
use. One record moves a score sum by at most C and adds one unit to the failure histogram whatever the
pipeline returns; a run charges exactly its plan; a pipeline fault stops the run quoting no record;
the preflight runs the task's own public probe before any charge."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dp_textgrad
from dp_textgrad.dp_es.preflight import PreflightError
from dp_textgrad.engines.scripted import ScriptedEngine
from dp_textgrad.privacy.accounting.events import group_events
from dp_textgrad.privacy.data import PrivateBatch, PrivateDataset
from dp_textgrad.tasks.base import Task
from dp_textgrad.tasks.scored import SCORED_CATEGORIES, ScoredExample, ScoredTask, category_of
from tests.dp_es.test_generation_privacy import charges, planned_atoms

SECRET = "Wilhelmina Okonkwo-Brandt"
RUN = dict(epsilon=3.0, generations=2, population=3, parents=2, sampling_rate=0.5, insecure_noise_seed=3, seed=1,
           evaluate=False, dataset_size=40)


def parity_records(n: int, start: int = 0) -> list[dict]:
    return [{"number": str(i), "answer": "odd" if i % 2 else "even"} for i in range(start, start + n)]


def parity_score(prompt: str, record: dict) -> float:
    """A toy pipeline: the prompt 'answers' odd when it says so, else even."""
    guess = "odd" if "odd" in prompt.lower() else "even"
    return float(guess == record["answer"])


def parity_task(score=parity_score, n: int = 40, **overrides) -> ScoredTask:
    settings = dict(
        name="parity",
        description="Say whether a number is odd or even.",
        private_train=PrivateDataset(parity_records(n)),
        test=parity_records(6, 100),
        score_record=score,
        public_examples=[
            ScoredExample(text="number: 3 -> odd", payload={"number": "3", "answer": "odd"}),
            ScoredExample(text="number: 4 -> even", payload={"number": "4", "answer": "even"}),
        ],
        render_example=lambda p: f"number: {p['number']} -> {p['answer']}",
        seed_prompt="Answer.",
    )
    settings.update(overrides)
    return ScoredTask(**settings)


def test_a_scored_task_is_a_task() -> None:
    task = parity_task()
    assert isinstance(task, Task)
    assert task.feedback.kind == "failures" and task.feedback.names == tuple(SCORED_CATEGORIES)
    assert task.labels == [] and task.kind == "generate"


ANSWERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-10, 10),
    st.booleans(),
    st.none(),
    st.text(max_size=5),
    st.tuples(st.floats(allow_nan=True), st.sampled_from([*SCORED_CATEGORIES, "made_up"])),
)


@settings(max_examples=200, deadline=None)
@given(answers=st.lists(ANSWERS, min_size=1, max_size=12), clip=st.floats(0.1, 5.0))
def test_whatever_the_pipeline_returns_each_record_adds_one_unit_and_at_most_C(answers, clip) -> None:
    by_number = {str(i): a for i, a in enumerate(answers)}
    task = parity_task(score=lambda prompt, record: by_number[record["number"]], n=len(answers), clip_bound=clip)
    outcomes = task.private_outcomes(ScriptedEngine(), "p", PrivateBatch(list(task.private_train)))
    assert np.all(outcomes.scores >= 0) and np.all(outcomes.scores <= clip + 1e-12)
    counts = task.feedback_counts(outcomes)
    assert counts.shape == (len(SCORED_CATEGORIES),) and counts.sum() == len(answers)


def test_categories_follow_one_public_rule() -> None:
    names = list(SCORED_CATEGORIES)
    assert category_of(True, names) == (1.0, names.index("correct"))
    assert category_of(0.25, names) == (0.25, names.index("partial"))
    assert category_of(-3, names) == (0.0, names.index("wrong"))
    assert category_of(float("nan"), names) == (0.0, names.index("unparsed"))
    assert category_of("not a number", names) == (0.0, names.index("unparsed"))
    assert category_of((0.0, "unparsed"), names) == (0.0, names.index("unparsed"))
    assert category_of((0.5, "made_up"), names) == (0.5, names.index("partial"))


def test_threads_score_each_record_alone_and_keep_the_order() -> None:
    seen: list[tuple[int, str]] = []
    lock = threading.Lock()

    def score(prompt: str, record: dict) -> float:
        with lock:
            seen.append((threading.get_ident(), record["number"]))
        return float(int(record["number"]) % 3 == 0)

    task = parity_task(score=score, n=12, threads=4)
    outcomes = task.private_outcomes(ScriptedEngine(), "p", PrivateBatch(list(task.private_train)))
    assert outcomes.scores.tolist() == [float(i % 3 == 0) for i in range(12)]
    assert sorted(number for _, number in seen) == sorted(str(i) for i in range(12))


def test_a_run_charges_exactly_its_plan_and_the_demos_come_from_public_examples(tmp_path) -> None:
    outcome = dp_textgrad.optimize(parity_task(), ScriptedEngine(), runs_root=tmp_path, **RUN)
    optimizer = outcome.optimizer
    assert group_events(optimizer.ledger.events) == group_events([optimizer.plan.event])
    search = [c for c in charges(outcome.run_dir) if c["label"].startswith(("generation ", "final "))]
    assert search and [c["event"] for c in search] == planned_atoms(outcome.run_dir)
    released = outcome.result.prompt
    for number in range(40):  # only public demos (3 and 4) can be in the prompt
        assert f"number: {number} " not in released or number in (3, 4)


def test_a_pipeline_fault_on_one_record_is_data_and_quotes_nothing(tmp_path) -> None:
    def failing(prompt: str, record: dict) -> float:
        if record["number"] == "7":
            raise ConnectionError(f"server dropped the request for {SECRET} ({record})")
        return 1.0

    records = parity_records(40)
    records[7] = {"number": "7", "answer": SECRET}
    task = parity_task(score=failing, private_train=PrivateDataset(records))
    # The failing record scores 0 in the public `error` category; the run goes on to its end.
    outcome = dp_textgrad.optimize(task, ScriptedEngine(), runs_root=tmp_path, **{**RUN, "sampling_rate": 1.0})
    assert outcome.result.stopped_because == "all generations done"
    found = task._outcomes("p", records)
    assert list(found.failed).index(True) == 7 and found.scores[7] == 0.0
    assert list(task.categories)[found.categories[7]] == "error"
    for path in tmp_path.rglob("*"):
        if path.is_file() and "operator" not in path.relative_to(tmp_path).parts:
            assert SECRET not in path.read_text(encoding="utf-8", errors="replace"), path
    errors = (outcome.run_dir / "operator" / "errors.log").read_text()
    assert "ConnectionError" in errors and SECRET in errors  # the operator keeps the detail


def test_a_pipeline_fault_on_a_public_example_is_named(tmp_path) -> None:
    def failing(prompt: str, record: dict) -> float:
        raise ConnectionError("server down")

    task = parity_task(score=failing)
    with pytest.raises(RuntimeError, match="server down"):
        task.public_outcomes("p", task.test)


def test_the_preflight_runs_the_tasks_public_probe_before_any_charge(tmp_path) -> None:
    probed: list[str] = []

    def probe(prompt: str) -> None:
        probed.append(prompt)
        raise RuntimeError("the pipeline's model is not loaded")

    with pytest.raises(PreflightError, match="pipeline failed on a public probe.*model is not loaded"):
        dp_textgrad.optimize(parity_task(probe=probe), ScriptedEngine(), runs_root=tmp_path, **RUN)
    assert probed == ["Answer."]
    ledgers = tmp_path.rglob("ledger.jsonl")
    assert not any(line.strip() for path in ledgers for line in path.read_text().splitlines()[1:])


def test_a_resume_replays_a_charge_only_for_a_deterministic_pipeline() -> None:
    from dp_textgrad.dp_es.scorer import DPScorer

    class Backend:
        subsample_from_seed = True

    def replays(task: ScoredTask) -> bool:
        scorer = object.__new__(DPScorer)
        scorer.backend, scorer.engine, scorer.task = Backend(), ScriptedEngine(), task
        return bool(scorer.replays_exactly)

    engine_is_deterministic = bool(getattr(ScriptedEngine(), "deterministic_scores", False))
    assert replays(parity_task(deterministic=False)) is False
    assert replays(parity_task(deterministic=True)) is engine_is_deterministic


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("threads", 0, "threads: must be an int >= 1"),
        ("clip_bound", 0.0, "clip_bound: must be > 0"),
        ("score_record", "not callable", "score_record: must be a callable"),
        ("private_train", [{"number": "1"}], "private_train: wrap the private records"),
        ("categories", {}, "categories: a scored task needs"),
    ],
)
def test_bad_settings_name_the_field(field, value, message) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        parity_task(**{field: value})
