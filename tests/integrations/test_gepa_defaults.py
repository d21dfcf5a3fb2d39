"""GEPA's call shape as a GEPA user meets it (issue 49): no files in the working directory, empty
hook lists accepted, a public probe that catches a broken task LM and a component the adapter never
shows before anything is charged, a completion-style default for base models, token, stop and
budget defaults that fit, and progress made of released values."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("gepa")

from gepa.adapters.default_adapter.default_adapter import DefaultAdapter, EvaluationResult  # noqa: E402
from gepa.core.adapter import EvaluationBatch  # noqa: E402

from dp_textgrad import runs  # noqa: E402
from dp_textgrad.dp_es.config import ConfigError, DPESConfig  # noqa: E402
from dp_textgrad.dp_es.preflight import PreflightError  # noqa: E402
from dp_textgrad.engines.scripted import ScriptedEngine  # noqa: E402
from dp_textgrad.integrations import gepa as dp_gepa  # noqa: E402
from dp_textgrad.privacy.accounting.lifetime import LifetimeBudget  # noqa: E402
from dp_textgrad.privacy.data import PrivateScoringError  # noqa: E402
from tests.integrations.test_gepa import PUBLIC, SCHEDULE, SEED, KeywordAdapter, private_records  # noqa: E402

TWO = {"instructions": "Answer the question.", "format": "Reply with one word."}


def default_records(n: int = 8) -> list[dict[str, Any]]:
    return [{"input": f"q{i}", "additional_context": {}, "answer": "yes" if i % 2 else "no"} for i in range(n)]


def ledger_charges(run_dir: Path) -> list[dict[str, Any]]:
    """The ledger's charges (its first line is the header); none when there is no ledger."""
    ledger = run_dir / "ledger.jsonl"
    if not ledger.is_file():
        return []
    return [json.loads(line) for line in ledger.read_text(encoding="utf-8").splitlines()[1:] if line.strip()]


def spent_nothing(root: Path) -> None:
    """No run under ``root`` charged anything: its ledger, and the lifetime store, hold no charge."""
    for run_dir in [p for p in root.iterdir() if p.is_dir() and p.name.startswith("run-")]:
        assert ledger_charges(run_dir) == [], run_dir
        store = runs.lifetime_store(root)
        if store.is_file():
            assert LifetimeBudget(store).entries(run_dir.name) == []


# -- 1. no files in the working directory --------------------------------------------------------
def test_a_call_with_defaults_leaves_the_working_directory_unchanged(tmp_path, monkeypatch) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    result = dp_gepa.optimize(
        {"instructions": "Answer the question."},
        private_records(),
        adapter=KeywordAdapter(),
        public_trainset=PUBLIC,
        dataset_size=12,
        **SCHEDULE,
    )
    assert list(work.iterdir()) == []  # no ./runs, nothing else
    # the runs root of the library: $DP_TEXTGRAD_HOME/runs (tests/conftest.py points it at a temp folder)
    assert result.outcome.run_dir.parent == runs.default_runs_root()
    assert runs.lifetime_store(runs.default_runs_root()).is_file()  # the lifetime store lives with the runs


# -- 2. empty hook lists ask for nothing ---------------------------------------------------------
def test_empty_hook_lists_are_accepted_and_non_empty_ones_refused_by_name(tmp_path) -> None:
    result = dp_gepa.optimize(
        SEED,
        private_records(),
        adapter=KeywordAdapter(),
        component="instructions",
        public_trainset=PUBLIC,
        dataset_size=12,
        runs_root=tmp_path,
        stop_callbacks=[],
        callbacks=(),
        reflection_lm_kwargs={},
        wandb_init_kwargs={},
        **SCHEDULE,
    )
    assert result.best_candidate["format"] == SEED["format"]
    for name in ("stop_callbacks", "callbacks"):
        with pytest.raises(ConfigError, match=rf"^{name}: refused: "):
            dp_gepa.optimize(SEED, private_records(), adapter=KeywordAdapter(), **{name: [lambda *a: True]})
    with pytest.raises(ConfigError, match="^reflection_lm_kwargs: refused: "):
        dp_gepa.optimize(SEED, private_records(), adapter=KeywordAdapter(), reflection_lm_kwargs={"temperature": 1})
    assert set(dp_gepa.EMPTY_ACCEPTED) <= set(dp_gepa.GEPA_REFUSED_ARGUMENTS)


# -- 3. the public probe: a broken task LM costs nothing -----------------------------------------
class BrokenLM:
    def __init__(self) -> None:
        self.inputs: list[str] = []

    def __call__(self, messages):
        self.inputs.append(messages[-1]["content"])
        raise RuntimeError("connection refused by 127.0.0.1:9")


@pytest.mark.parametrize(
    "options",
    [dict(dataset_size=8), dict(), dict(public_input="is the sky blue")],
    ids=["N declared", "N counted", "public_input"],
)
def test_a_broken_task_lm_fails_in_the_public_probe_with_epsilon_0_spent(tmp_path, options) -> None:
    lm = BrokenLM()
    with pytest.raises(PreflightError, match=r"public probe .*epsilon 0 spent.*connection refused by 127\.0\.0\.1:9"):
        dp_gepa.optimize(
            {"system_prompt": "Say yes or no."}, default_records(), task_lm=lm, runs_root=tmp_path, **options
        )
    assert lm.inputs == [options.get("public_input", dp_gepa.PROBE_INPUT)]  # the probe only, no private input
    assert not tmp_path.exists() or list(tmp_path.iterdir()) == []  # no run, no ledger, no lifetime charge


def test_the_probe_uses_the_task_description_when_nothing_public_is_given(tmp_path) -> None:
    lm = BrokenLM()
    with pytest.raises(PreflightError):
        dp_gepa.optimize(
            {"system_prompt": "Say yes or no."},
            default_records(),
            task_lm=lm,
            task_description="Decide whether a question's answer is yes.",
            runs_root=tmp_path,
        )
    assert lm.inputs == ["Decide whether a question's answer is yes."]


class FailingAdapter(KeywordAdapter):
    def evaluate(self, batch, candidate, capture_traces=False):
        raise RuntimeError("adapter cannot reach its model")


def test_a_user_adapter_is_probed_on_public_input_before_any_charge(tmp_path) -> None:
    with pytest.raises(PreflightError, match="public probe.*adapter cannot reach its model"):
        dp_gepa.optimize(
            {"instructions": "Answer."},
            private_records(),
            adapter=FailingAdapter(),
            public_input={"id": "p9", "input": "is ice cold", "answer": "yes"},
            runs_root=tmp_path,
            **SCHEDULE,
        )
    spent_nothing(tmp_path)


def test_a_user_adapter_without_a_public_instance_is_warned_about(tmp_path) -> None:
    with pytest.warns(UserWarning, match="public_input: no public instance to probe your adapter"):
        dp_gepa.optimize(
            {"instructions": "Answer."},
            private_records(),
            adapter=KeywordAdapter(),
            dataset_size=12,
            runs_root=tmp_path,
            **SCHEDULE,
        )


def test_a_failure_while_scoring_private_records_names_the_errors_log(tmp_path, monkeypatch) -> None:
    # A machinery fault inside the DP scorer (failures of the adapter on a record are scores of 0)
    from dp_textgrad.dp_es.scorer import DPScorer

    def broken(self, *args, **kwargs):
        raise RuntimeError("machinery fault on a private record: question 3")

    monkeypatch.setattr(DPScorer, "_totals", broken)
    with pytest.raises(PrivateScoringError) as caught:
        dp_gepa.optimize(
            {"instructions": "Answer."},
            private_records(),
            adapter=KeywordAdapter(),
            public_trainset=PUBLIC,
            dataset_size=12,
            runs_root=tmp_path,
            display_progress_bar=False,
            **SCHEDULE,
        )
    message = str(caught.value)
    assert "question 3" not in message  # the message quotes no record
    (run_dir,) = [p for p in tmp_path.iterdir() if p.name.startswith("run-")]
    log = run_dir / "operator" / "errors.log"
    assert str(log) in message and "OPERATOR-ONLY" in message
    assert "question 3" in log.read_text(encoding="utf-8")  # the operator keeps the detail


# -- 4. a component the adapter never shows is refused before any charge -------------------------
class RecordingLM:
    def __init__(self, answer: str = "yes") -> None:
        self.messages: list[list[dict[str, str]]] = []
        self.answer = answer

    def __call__(self, messages):
        self.messages.append(list(messages))
        return self.answer


def test_a_component_gepas_default_adapter_never_renders_is_refused_by_name(tmp_path) -> None:
    lm = RecordingLM()
    with pytest.raises(
        ConfigError,
        match=r"^component: 'format' never reaches the task LM: .*DefaultAdapter sends only the first component "
        r"\('instructions'\).*put 'format' first",
    ):
        dp_gepa.optimize(TWO, default_records(), task_lm=lm, component="format", dataset_size=8, runs_root=tmp_path)
    assert [m[-1]["content"] for m in lm.messages] == [dp_gepa.PROBE_INPUT]  # one public probe call
    assert not tmp_path.exists() or list(tmp_path.iterdir()) == []  # nothing written, nothing charged


def test_the_first_component_passes_the_check_and_the_others_stay_fixed(tmp_path) -> None:
    lm = RecordingLM()
    result = dp_gepa.optimize(
        TWO,
        default_records(),
        task_lm=lm,
        component="instructions",
        runs_root=tmp_path,
        display_progress_bar=False,
        **{**SCHEDULE, "dataset_size": 8},
    )
    assert result.best_candidate["format"] == TWO["format"]
    assert lm.messages[0][0]["content"].startswith("DPTGPROBE")  # the marker reached the system message


class FirstOnlyAdapter(KeywordAdapter):
    """A user's adapter that sends the model the 'instructions' component only."""

    def __init__(self, lm: Any, components: tuple[str, ...] = ("instructions",)) -> None:
        super().__init__()
        self.lm = lm
        self.components = components

    def evaluate(self, batch, candidate, capture_traces=False):
        system = "\n".join(candidate[name] for name in self.components)
        outputs = [
            self.lm([{"role": "system", "content": system}, {"role": "user", "content": r["input"]}]) for r in batch
        ]
        return EvaluationBatch(outputs=outputs, scores=[float(r["answer"] in o) for r, o in zip(batch, outputs)])


def test_a_user_adapter_is_checked_when_its_task_lm_is_watched(tmp_path) -> None:
    options = dict(component="format", public_trainset=PUBLIC, dataset_size=12, runs_root=tmp_path, **SCHEDULE)
    lm = dp_gepa.WatchedLM(RecordingLM())
    with pytest.raises(ConfigError, match=r"^component: 'format' never reaches the task LM.*candidate\['format'\]"):
        dp_gepa.optimize(TWO, private_records(), adapter=FirstOnlyAdapter(lm), task_lm=lm, **options)
    assert not tmp_path.exists() or list(tmp_path.iterdir()) == []

    both = dp_gepa.WatchedLM(RecordingLM())
    adapter = FirstOnlyAdapter(both, ("instructions", "format"))
    result = dp_gepa.optimize(
        TWO, private_records(), adapter=adapter, task_lm=both, display_progress_bar=False, **options
    )
    assert result.best_candidate["instructions"] == TWO["instructions"]
    assert both._seen is None  # the watcher keeps nothing outside the public probe

    with pytest.raises(ConfigError, match="task_lm: your adapter never called the WatchedLM"):
        dp_gepa.optimize(
            TWO, private_records(), adapter=KeywordAdapter(), task_lm=dp_gepa.WatchedLM(RecordingLM()), **options
        )
    with pytest.raises(ConfigError, match="task_lm: with an adapter.*WatchedLM"):
        dp_gepa.optimize(TWO, private_records(), adapter=KeywordAdapter(), task_lm=RecordingLM(), **options)


def test_every_component_by_default_is_refused_where_the_default_adapter_hides_one(tmp_path) -> None:
    # component=None optimizes every component: with GEPA's DefaultAdapter, 'format' never reaches
    # the model, so the whole run is refused by name before any charge (issue 49: it used to spend
    # the budget and optimize nothing)
    lm = RecordingLM()
    with pytest.raises(ConfigError, match=r"^component: 'format' never reaches the task LM"):
        dp_gepa.optimize(TWO, default_records(), task_lm=lm, dataset_size=8, runs_root=tmp_path)
    assert not tmp_path.exists() or list(tmp_path.iterdir()) == []


def test_two_components_are_optimized_together_one_per_child(tmp_path) -> None:
    from dp_textgrad.tasks.components import split_components

    engine = ScriptedEngine(base_model)
    engine.instruction_following = False
    public = capital_records()[:4]
    result = dp_gepa.optimize(
        TWO,
        capital_records(),
        task_lm=dp_gepa.task_lm_from_engine(engine),
        evaluator=exact_match,
        public_trainset=public,
        runs_root=tmp_path,
        display_progress_bar=False,
        **{**SCHEDULE, "generations": 3, "population": 4, "dataset_size": 6},
    )
    assert result.component == "instructions, format" and result.dp_guarantee.optimized == "instructions, format"
    archive = {c.id: c for c in result.outcome.optimizer.population.archive}
    edited = set()
    for child in archive.values():
        if child.parent_ids and child.parent_ids[0] in archive:
            mine = split_components(child.text, list(TWO))
            theirs = split_components(archive[child.parent_ids[0]].text, list(TWO))
            changed = [name for name in TWO if mine[name] != theirs[name]]
            assert changed == [child.operator_meta["component"]]
            edited.update(changed)
    assert edited == set(TWO)  # both components were edited, in turn
    assert set(result.best_candidate) == set(TWO) and all(result.best_candidate.values())


# -- 5. a completion-style default for base models -----------------------------------------------
CAPITALS = {"France": "Paris", "Italy": "Rome", "Spain": "Madrid", "Japan": "Tokyo", "Egypt": "Cairo", "Peru": "Lima"}


def base_model(prompt: str, system_prompt: str | None) -> str:
    """A scripted base model: after an 'answer:' line it answers and writes on (as base models do);
    given a bare request, it continues the request instead of answering it."""
    question = prompt.rsplit("input:", 1)[-1]
    if prompt.rstrip().endswith("answer:"):
        country = next((c for c in CAPITALS if c in question), "")
        return f" {CAPITALS.get(country, 'unknown')}\n\ninput: the capital of Chile\nanswer: Santiago"
    return " and its population, in a long paragraph."


def exact_match(data, response) -> EvaluationResult:
    return EvaluationResult(score=float(response.strip() == data["answer"]), feedback="")


def capital_records() -> list[dict[str, Any]]:
    return [{"input": f"the capital of {c}", "additional_context": {}, "answer": a} for c, a in CAPITALS.items()]


def test_a_base_model_gets_a_completion_layout_by_default(tmp_path) -> None:
    engine = ScriptedEngine(base_model)
    engine.instruction_following = False
    task_lm = dp_gepa.task_lm_from_engine(engine)
    valset = capital_records()[:3]
    result = dp_gepa.optimize(
        TWO,
        capital_records(),
        valset=valset,
        task_lm=task_lm,
        evaluator=exact_match,
        component="format",  # every component reaches a base model in the completion layout
        runs_root=tmp_path,
        display_progress_bar=False,
        **{**SCHEDULE, "dataset_size": 6},
    )
    assert result.val_aggregate_scores is not None and result.val_aggregate_scores[0] == 1.0  # strict exact match
    layout = f"{TWO['instructions']}\n\n{TWO['format']}\n\ninput: the capital of Spain\nanswer:"
    (call,) = [c for c in engine.history if c.prompt == layout]  # the seed on the last valset instance
    assert call.system_prompt is None and call.stop == dp_gepa.COMPLETION_STOP
    assert call.max_tokens == dp_gepa.DEFAULT_TASK_MAX_TOKENS == 32

    # GEPA's chat layout on the same base model: it continues the request, exact match 0
    chat = DefaultAdapter(model=task_lm, evaluator=exact_match)
    assert chat.evaluate(valset, TWO).scores == [0.0, 0.0, 0.0]
    assert dp_gepa.CompletionAdapter(task_lm, exact_match).evaluate(valset, TWO).scores == [1.0, 1.0, 1.0]


def test_a_chat_engine_keeps_gepas_default_adapter(tmp_path) -> None:
    engine = ScriptedEngine(default="yes", responses={"zzz": "no"})
    seen: list[Any] = []
    task_lm = dp_gepa.task_lm_from_engine(engine)
    adapter, watched = dp_gepa._adapter(None, task_lm, None)
    assert isinstance(adapter, DefaultAdapter) and watched is not None and watched.lm is task_lm
    engine.instruction_following = False
    adapter, _ = dp_gepa._adapter(None, task_lm, None)
    assert isinstance(adapter, dp_gepa.CompletionAdapter)
    adapter, _ = dp_gepa._adapter(None, lambda messages: seen.append(messages) or "", None)
    assert isinstance(adapter, DefaultAdapter)  # a plain callable: a chat model, as in GEPA


def test_completion_adapter_reads_the_first_line_and_refuses_reflection() -> None:
    adapter = dp_gepa.CompletionAdapter(lambda messages: "\n  Paris  \ninput: more")
    assert adapter.evaluate([{"input": "x", "answer": "Paris"}], {"c": "Say."}).scores == [1.0]
    assert dp_gepa.CompletionAdapter.answer("\n\n") == ""
    with pytest.raises(NotImplementedError, match="never shows private traces"):
        adapter.make_reflective_dataset({}, None, ["c"])
    with pytest.raises(TypeError, match="dicts with 'input'"):
        adapter.evaluate(["plain text"], {"c": "Say."})


# -- 6. token, stop and budget defaults ----------------------------------------------------------
def test_task_lm_from_engine_defaults_are_short_and_stop_a_base_model() -> None:
    chat = ScriptedEngine(["an answer"])
    dp_gepa.task_lm_from_engine(chat)([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    (call,) = chat.history
    assert (call.prompt, call.system_prompt, call.max_tokens, call.stop) == ("Hi", "Be brief.", 32, ())

    base = ScriptedEngine(["Paris\n\nmore"])
    base.instruction_following = False
    answer = dp_gepa.task_lm_from_engine(base)([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}])
    (call,) = base.history
    assert (call.prompt, call.system_prompt, call.stop, answer) == ("S\n\nU", None, ("\n\n", "\ninput:"), "Paris")

    own = ScriptedEngine(["x"])
    dp_gepa.task_lm_from_engine(own, max_tokens=5, stop=["###"])([{"role": "user", "content": "U"}])
    assert (own.history[0].max_tokens, own.history[0].stop) == (5, ("###",))
    with pytest.raises(ValueError, match="stop: use 'auto', None, or a list"):
        dp_gepa.task_lm_from_engine(own, stop="\n")
    with pytest.raises(ValueError, match="max_tokens: must be an int >= 1"):
        dp_gepa.task_lm_from_engine(own, max_tokens=0)


@pytest.mark.parametrize(
    ("calls", "expected"),
    [(150, {"generations": 1, "sampling_rate": 0.125}), (500, {"generations": 3, "sampling_rate": 0.138888})],
)
def test_typical_gepa_budgets_map_to_a_feasible_schedule(calls, expected) -> None:
    config = DPESConfig(dataset_size=200)  # population 6, the default rate: 150 records a candidate
    assert dp_gepa._schedule_for(calls, config) == expected
    planned = 6 * expected["sampling_rate"] * 200 * expected["generations"]
    assert planned <= calls
    # a large budget keeps the default rate: 20,000 calls = 22 generations of 6 x 150
    assert dp_gepa._schedule_for(20_000, config) == {"generations": 22}
    # a charged final selection is paid for as one more round
    assert dp_gepa._schedule_for(500, DPESConfig(dataset_size=200, final_selection="exponential")) == {
        "generations": 3,
        "sampling_rate": 0.104166,
    }


def test_budgets_too_small_are_refused_with_the_numbers() -> None:
    with pytest.raises(ConfigError, match=r"max_metric_calls: 100 is too few.*at least 120.*population=2 needs 40"):
        dp_gepa._schedule_for(100, DPESConfig(dataset_size=200))
    with pytest.raises(ConfigError, match=r"max_metric_calls: 500 cannot pay.*declare dataset_size.*at least 900"):
        dp_gepa._schedule_for(500, DPESConfig())


def test_max_metric_calls_500_runs_within_its_budget(tmp_path) -> None:
    records = [{"id": i, "input": f"question {i}", "answer": "yes" if i % 2 else "no"} for i in range(200)]
    adapter = KeywordAdapter()
    result = dp_gepa.optimize(
        {"instructions": "Answer the question."},
        records,
        adapter=adapter,
        public_trainset=PUBLIC,
        dataset_size=200,
        max_metric_calls=500,
        runs_root=tmp_path,
        insecure_noise_seed=1,
        display_progress_bar=False,
    )
    config = result.outcome.optimizer.config
    assert (config.generations, config.population) == (3, 6)
    assert result.expected_metric_calls <= 500


# -- 7. progress: released values only -----------------------------------------------------------
def test_progress_shows_generation_best_estimate_and_epsilon_and_can_be_turned_off(tmp_path, capsys, caplog) -> None:
    caplog.set_level(logging.INFO, logger="dp_textgrad.integrations.gepa")
    options = dict(adapter=KeywordAdapter, public_trainset=PUBLIC, dataset_size=12, runs_root=tmp_path, **SCHEDULE)
    options["adapter"] = KeywordAdapter()
    result = dp_gepa.optimize({"instructions": "Answer the question."}, private_records(), **options)
    bar = capsys.readouterr().err
    reports = result.outcome.result.history
    assert "2/2 generations" in bar and f"best {reports[-1].best_estimate:.3f}" in bar and "epsilon spent" in bar
    assert not re.search(r"it/s|s/it|\d\d:\d\d", bar)  # no rate, no elapsed time: they time the private phase
    lines = [r.getMessage() for r in caplog.records if "generation" in r.getMessage() and "best" in r.getMessage()]
    assert len(lines) == 2 and "generation 1/2, best noisy estimate" in lines[0]
    for record in private_records():
        assert record["input"] not in bar + "\n".join(r.getMessage() for r in caplog.records)

    caplog.clear()
    options["adapter"] = KeywordAdapter()
    dp_gepa.optimize({"instructions": "Answer the question."}, private_records(), display_progress_bar=False, **options)
    assert "generations" not in capsys.readouterr().err  # no bar
    assert any("generation 2/2" in r.getMessage() for r in caplog.records)  # the log lines stay
    with pytest.raises(ConfigError, match="display_progress_bar: True or False"):
        dp_gepa.optimize({"instructions": "A."}, private_records(), display_progress_bar="yes", **options)
