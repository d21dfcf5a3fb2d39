"""The DSPy optimizer ``DPES`` (``dp_textgrad.integrations.dspy``) on fake models: DSPy's metric
conventions work unchanged, what DPES cannot keep private is refused before anything is charged,
the ledger is the plan atom for atom, the compiled program's instruction and guarantee survive
DSPy's own ``save``/``load`` into a fresh program, and the adapters and LM bridges do what they say.

Every model is a fake (a canonical DSPy engine behind ``dspy.LM``, or ``ScriptedEngine``), so the
module runs in seconds; ``test_dspy_server.py`` runs the real llama.cpp server.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

dspy = pytest.importorskip("dspy", reason="needs the [dspy] extra: pip install -e '.[dspy]'")

from dspy.lm15 import Message, Response, TextPart, Usage  # noqa: E402

from dp_textgrad.dp_es.config import ConfigError  # noqa: E402
from dp_textgrad.dp_es.mutation.text_edits import norm_block, parse_layout  # noqa: E402
from dp_textgrad.dp_es.preflight import PreflightError  # noqa: E402
from dp_textgrad.integrations.dspy.program_task import render_demo  # noqa: E402
from dp_textgrad.engines.scripted import ScriptedEngine  # noqa: E402
from dp_textgrad.integrations.dspy import (  # noqa: E402
    AUTO_PRESETS,
    DPES,
    CompletionAdapter,
    DPGuarantee,
    DSPyLMEngine,
    EngineLM,
    program_as_task,
)
from dp_textgrad.privacy.accounting.events import group_events  # noqa: E402
from tests.dp_es.test_generation_privacy import charges, planned_atoms  # noqa: E402

SECRET = "Wilhelmina Okonkwo-Brandt"
RUN = dict(
    epsilon=2.0,
    generations=2,
    population=3,
    parents=2,
    sampling_rate=0.5,
    insecure_noise_seed=3,
    seed=1,
    dataset_size=24,
)


# -- a fake model: a canonical DSPy engine (no network) ------------------------------------------------
class MoodEngine:
    """Answers the ChatAdapter's format: ``positive`` for a text holding "good", else ``negative``;
    an instruction holding "ALWAYS NEGATIVE" answers ``negative``; a text holding "garble" gets an
    unparseable reply; one holding "crash" raises (a server that fails). Counts its calls."""

    def __init__(self) -> None:
        self.calls = 0
        self.lock = threading.Lock()

    def complete(self, request: Any) -> Response:
        with self.lock:
            self.calls += 1
        system = request.system if isinstance(request.system, str) else ""
        text = (request.messages[-1].text or "") if request.messages else ""
        record = text.split("[[ ## text ## ]]")[-1]
        if "crash" in record:
            raise ConnectionError(f"server dropped the request: {text}")
        if "garble" in record:
            reply = "I cannot say."
        else:
            label = "negative" if "ALWAYS NEGATIVE" in system or "good" not in record else "positive"
            reply = f"[[ ## label ## ]]\n{label}\n\n[[ ## completed ## ]]"
        return Response(
            id=None,
            model="mood",
            message=Message.assistant([TextPart(reply)]),
            finish_reason="stop",
            usage=Usage(input_tokens=1, output_tokens=1, total_tokens=2),
        )

    def close(self) -> None:
        pass


def mood_lm(engine: MoodEngine | None = None, **kwargs: Any) -> Any:
    """A ``dspy.LM`` on the fake engine; DSPy's response cache off unless asked (the disk cache
    would keep the tests' calls between runs)."""
    kwargs.setdefault("cache", False)
    return dspy.LM("mood/fake", engine=engine or MoodEngine(), **kwargs)


def example(text: str, label: str) -> Any:
    return dspy.Example(text=text, label=label).with_inputs("text")


def records(n: int = 24) -> list[Any]:
    return [
        example(f"a {'good' if i % 2 else 'bad'} day number {i}", "positive" if i % 2 else "negative") for i in range(n)
    ]


PUBLIC = [example("a good film", "positive"), example("a bad film", "negative")]


def bool_metric(example: Any, prediction: Any, trace: Any = None) -> bool:
    return prediction.label == example.label


def float_metric(example: Any, prediction: Any, trace: Any = None) -> float:
    return 0.5 if prediction.label == example.label else 0.0


def prediction_metric(example: Any, prediction: Any, trace: Any = None) -> Any:
    right = prediction.label == example.label
    return dspy.Prediction(score=float(right), feedback=f"expected {example.label} for {example.text}")


def two_argument_metric(example: Any, prediction: Any) -> int:
    return int(prediction.label == example.label)


class Classifier(dspy.Module):
    """A user's program class (saved and loaded into a fresh instance)."""

    def __init__(self) -> None:
        super().__init__()
        self.classify = dspy.Predict("text -> label")

    def forward(self, text: str) -> Any:
        return self.classify(text=text)


class TwoSteps(dspy.Module):
    def __init__(self) -> None:
        super().__init__()
        self.summarize = dspy.Predict("text -> summary")
        self.classify = dspy.ChainOfThought("text -> label")

    def forward(self, text: str) -> Any:
        return self.classify(text=text)


def optimizer(tmp_path: Path, metric: Any = bool_metric, **overrides: Any) -> DPES:
    settings: dict[str, Any] = dict(lm=mood_lm(), public_trainset=PUBLIC, runs_root=tmp_path, **RUN)
    settings.update(overrides)
    return DPES(metric, **settings)


def no_run_started(tmp_path: Path) -> bool:
    return not any(tmp_path.rglob("ledger.jsonl"))


# -- 1. DSPy's metric conventions, unchanged ------------------------------------------------------------
@pytest.mark.parametrize(
    ("metric", "right", "wrong"),
    [(bool_metric, 1.0, 0.0), (float_metric, 0.5, 0.0), (prediction_metric, 1.0, 0.0), (two_argument_metric, 1.0, 0.0)],
    ids=["bool", "float", "prediction-with-score", "two-arguments"],
)
def test_a_dspy_metric_scores_each_record_unchanged(metric, right, wrong) -> None:
    program = dspy.Predict("text -> label")
    task = program_as_task(program, metric, records(4), predictor_name="self", lm=mood_lm())
    good, bad = example("a good day", "positive"), example("a good day", "negative")
    assert task.score_record("Label the mood.", good) == right
    assert task.score_record("Label the mood.", bad) == wrong
    # the candidate prompt is the predictor's instruction: this one makes the model answer negative
    assert task.score_record("ALWAYS NEGATIVE", good) == wrong


def test_a_metric_gets_trace_none_and_the_example_and_prediction() -> None:
    seen: list[tuple[Any, Any, Any]] = []

    def metric(example: Any, prediction: Any, trace: Any = "unset") -> float:
        seen.append((example, prediction, trace))
        return 1.0

    program = dspy.Predict("text -> label")
    task = program_as_task(program, metric, records(2), predictor_name="self", lm=mood_lm())
    record = example("a good day", "positive")
    task.score_record("p", record)
    ((got_example, prediction, trace),) = seen
    assert got_example is record and trace is None and prediction.label == "positive"


def test_a_parse_failure_or_a_failing_metric_is_unparsed_and_an_lm_failure_propagates() -> None:
    def failing_metric(example: Any, prediction: Any, trace: Any = None) -> float:
        raise KeyError("the metric looked for a field that is not there")

    program = dspy.Predict("text -> label")
    task = program_as_task(program, bool_metric, records(2), predictor_name="self", lm=mood_lm())
    assert task.score_record("p", example("garble this", "positive")) == (0.0, "unparsed")
    failing = program_as_task(program, failing_metric, records(2), predictor_name="self", lm=mood_lm())
    assert failing.score_record("p", example("a good day", "positive")) == (0.0, "unparsed")
    with pytest.raises(Exception) as caught:
        task.score_record("p", example("crash now", "positive"))
    assert not isinstance(caught.value, dspy.AdapterParseError)


def test_an_lm_failure_on_a_private_record_is_data_and_quotes_nothing(tmp_path) -> None:
    # The failing record scores 0 in the public `error` category; the compile goes on to its end,
    # exactly as it does without that record (issue 47: a failure must not decide the outcome).
    private = records()
    private[5] = example(f"crash for {SECRET}", "negative")
    compiled = optimizer(tmp_path, sampling_rate=1.0).compile(dspy.Predict("text -> label"), trainset=private)
    assert compiled is not None
    errors = next(tmp_path.rglob("operator/errors.log")).read_text()
    assert SECRET in errors  # the operator keeps the detail
    for path in tmp_path.rglob("*"):
        if path.is_file() and "operator" not in path.relative_to(tmp_path).parts:
            assert SECRET not in path.read_text(encoding="utf-8", errors="replace"), path


# -- 2. a compile: the ledger is the plan, the program carries its guarantee ---------------------------
def test_a_compile_charges_exactly_its_plan_and_releases_the_prompt(tmp_path) -> None:
    dpes = optimizer(tmp_path)
    student = Classifier()
    compiled = dpes.compile(student, trainset=records())
    outcome = dpes.outcome
    assert outcome is not None
    ledger = outcome.optimizer.ledger
    assert group_events(ledger.events) == group_events([outcome.optimizer.plan.event])
    search = [c for c in charges(outcome.run_dir) if c["label"].startswith(("generation ", "final "))]
    assert search and [c["event"] for c in search] == planned_atoms(outcome.run_dir)
    # the released prompt's instruction is the predictor's; its demonstration blocks are its demos,
    # the public examples themselves (DSPy's tools find them where they look)
    pool = [norm_block(render_demo(student.classify.signature, e)) for e in PUBLIC]
    layout = parse_layout(outcome.result.prompt, pool)
    assert compiled is not student and compiled.classify.signature.instructions == layout.instruction
    assert all(any(demo is e for e in PUBLIC) for demo in compiled.classify.demos)
    assert len(compiled.classify.demos) == len(layout.demos) and compiled._compiled
    guarantee = compiled.dp_guarantee
    assert isinstance(guarantee, DPGuarantee)
    assert guarantee.epsilon == pytest.approx(outcome.result.epsilon) and guarantee.epsilon <= 2.0 + 1e-9
    assert guarantee.delta == outcome.result.delta
    assert guarantee.epsilons[guarantee.accountant] == min(guarantee.epsilons.values())
    assert guarantee.optimized == "classify" and guarantee.run_id == outcome.run_dir.name
    assert guarantee.differentially_private is False  # seeded noise: a plan, not a guarantee
    with dspy.context(lm=mood_lm()):  # the compiled program runs
        assert compiled(text="a good book").label in ("positive", "negative")


def test_only_public_examples_become_demonstrations(tmp_path) -> None:
    private = records()
    for position, record in enumerate(private):
        private[position] = example(f"{record.text} zqpriv{position}", record.label)
    dpes = optimizer(tmp_path, generations=3, population=4)
    compiled = dpes.compile(dspy.Predict("text -> label"), trainset=private)
    released = compiled.signature.instructions
    assert "zqpriv" not in released and dpes.outcome is not None and "zqpriv" not in dpes.outcome.result.prompt
    assert all(any(demo is e for e in PUBLIC) for demo in compiled.demos)


def test_the_instruction_and_the_guarantee_survive_save_and_load_into_a_fresh_program(tmp_path) -> None:
    dpes = optimizer(tmp_path / "runs")
    compiled = dpes.compile(Classifier(), trainset=records())
    path = tmp_path / "program.json"
    compiled.save(str(path))
    saved = json.loads(path.read_text())
    assert saved["classify"]["dp_guarantee"] == compiled.dp_guarantee.as_dict()
    fresh = Classifier()
    assert DPGuarantee.of(fresh) is None
    fresh.load(str(path))
    assert fresh.classify.signature.instructions == compiled.classify.signature.instructions
    assert [dict(d) for d in fresh.classify.demos] == [dict(d) for d in compiled.classify.demos]
    assert DPGuarantee.of(fresh) == compiled.dp_guarantee
    assert DPGuarantee.of(compiled) == compiled.dp_guarantee
    # the compiled program is still a program of the user's class, its predictor still a Predict
    assert type(compiled) is Classifier and isinstance(compiled.classify, dspy.Predict)
    assert repr(compiled.classify) == repr(fresh.classify)
    again = compiled.deepcopy()
    again.save(str(tmp_path / "again.json"))
    assert (
        json.loads((tmp_path / "again.json").read_text())["classify"]["dp_guarantee"]
        == saved["classify"]["dp_guarantee"]
    )


def test_the_named_predictor_of_several_is_optimized_and_the_others_kept(tmp_path) -> None:
    student = TwoSteps()
    dpes = optimizer(tmp_path, predictor="classify.predict")
    compiled = dpes.compile(student, trainset=records())
    released = parse_layout(dpes.outcome.result.prompt, []).instruction
    assert compiled.classify.predict.signature.instructions in released
    assert compiled.summarize.signature.instructions == student.summarize.signature.instructions
    assert compiled.dp_guarantee.optimized == "classify.predict"


def test_valset_is_research_evaluation_only(tmp_path) -> None:
    dpes = optimizer(tmp_path)
    dpes.compile(dspy.Predict("text -> label"), trainset=records(), valset=records(4))
    assert dpes.outcome.evaluation is not None
    dpes_without = optimizer(tmp_path)
    dpes_without.compile(dspy.Predict("text -> label"), trainset=records())
    assert dpes_without.outcome.evaluation is None


def test_observers_get_each_generation(tmp_path) -> None:
    reports: list[Any] = []
    optimizer(tmp_path, observers=[reports.append]).compile(dspy.Predict("text -> label"), trainset=records())
    assert len(reports) == RUN["generations"]


def test_dspy_compile_callbacks_never_receive_the_trainset(tmp_path) -> None:
    from dspy.utils.callback import BaseCallback

    class Recorder(BaseCallback):
        def __init__(self) -> None:
            self.inputs: list[Any] = []
            self.events = 0

        def on_compile_start(self, call_id, instance, inputs):
            self.inputs.append(inputs)

        def on_lm_start(self, call_id, instance, inputs):
            self.events += 1

        def on_module_start(self, call_id, instance, inputs):
            self.events += 1

        def on_adapter_format_start(self, call_id, instance, inputs):
            self.events += 1

    recorder = Recorder()
    engine = MoodEngine()
    lm = mood_lm(engine, callbacks=[recorder])
    student = dspy.Predict("text -> label", callbacks=[recorder])
    with dspy.context(callbacks=[recorder], track_usage=True):
        optimizer(tmp_path, lm=lm, public_trainset=None).compile(student, trainset=records())
    assert recorder.inputs == [] and recorder.events == 0 and engine.calls > 0
    assert lm.history == [] and student.history == []


# -- 3. refusals, before anything is charged -----------------------------------------------------------
def held_demos() -> Any:
    program = Classifier()
    program.classify.demos = [example("a private example", "positive")]
    return program


@pytest.mark.parametrize(
    ("student", "trainset", "settings", "message"),
    [
        (held_demos, records, {}, "student: predictor.s. classify already hold demos.*reset_copy"),
        (TwoSteps, records, {"predictor": "nope"}, "predictor: no predictor named 'nope'"),
        (Classifier, list, {}, "trainset: empty"),
        (Classifier, lambda: [*records(3), {"text": SECRET}], {}, "trainset: rows 3 are not dspy.Example"),
        (Classifier, lambda: [*records(2), dspy.Example(text=SECRET, label="x")], {}, "trainset: rows 2 have no input"),
        (Classifier, lambda: "not a list", {}, "trainset: expected a list"),
        (
            Classifier,
            lambda: [*records(2), dspy.Example(text="x", label=SECRET).with_inputs("text", "label")],
            {},
            r"trainset: rows 2 mark other input fields than row 0 \(text\)",
        ),
        (
            Classifier,
            lambda: [dspy.Example(body="x", label="y").with_inputs("body") for _ in range(3)],
            {},
            r"public_trainset: its examples mark other input fields \(text\) than trainset's \(body\)",
        ),
        (
            lambda: dspy.ReAct("question -> answer", tools=[]),
            records,
            {},
            r"student: the program itself is a dspy.ReAct",
        ),
        (lambda: "a function", records, {}, "student: expected a dspy.Module"),
    ],
    ids=[
        "demos",
        "unknown-predictor",
        "empty",
        "not-examples",
        "no-inputs",
        "not-a-list",
        "other-inputs",
        "public-inputs-differ",
        "react",
        "not-a-module",
    ],
)
def test_what_dpes_cannot_keep_private_is_refused_before_any_charge(
    tmp_path, student, trainset, settings, message
) -> None:
    engine = MoodEngine()
    dpes = optimizer(tmp_path, lm=mood_lm(engine), **settings)
    with pytest.raises(ConfigError, match=message) as caught:
        dpes.compile(student(), trainset=trainset())
    assert SECRET not in str(caught.value)
    assert engine.calls == 0 and no_run_started(tmp_path)


def test_a_retriever_in_the_program_is_refused(tmp_path) -> None:
    class WithRetriever(dspy.Module):
        def __init__(self) -> None:
            super().__init__()
            self.retrieve = dspy.Retrieve(k=2)
            self.answer = dspy.Predict("text -> label")

    with pytest.raises(ConfigError, match=r"student: retrieve \(a dspy.Retrieve\) is refused.*dspy.settings.rm"):
        optimizer(tmp_path).compile(WithRetriever(), trainset=records())
    assert no_run_started(tmp_path)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"metric": "not callable"}, "metric: expected a callable"),
        ({"auto": "extreme"}, "auto: use one of"),
        ({"generations": 0}, "generations"),
        ({"made_up_setting": 1}, "made_up_setting"),
        ({"num_threads": 0}, "num_threads: must be an int >= 1"),
        ({"lm": "openai/gpt-4o"}, "lm: expected a dspy.LM"),
        ({"engine": "llama"}, "engine: expected a dp-textgrad engine"),
        ({"public_trainset": [{"text": "x"}]}, "public_trainset: rows 0 are not dspy.Example"),
        ({"adapter": "chat"}, "adapter: expected a dspy.Adapter"),
    ],
)
def test_bad_settings_name_the_field(tmp_path, settings, message) -> None:
    metric = settings.pop("metric", bool_metric)
    with pytest.raises(ConfigError, match=message):
        optimizer(tmp_path, metric, **settings)


def test_teacher_and_unknown_compile_arguments_are_refused(tmp_path) -> None:
    dpes = optimizer(tmp_path)
    with pytest.raises(ConfigError, match="teacher: DPES does not use a teacher"):
        dpes.compile(Classifier(), trainset=records(), teacher=Classifier())
    with pytest.raises(ConfigError, match="max_bootstrapped_demos: not a DPES.compile setting"):
        dpes.compile(Classifier(), trainset=records(), max_bootstrapped_demos=4)
    assert no_run_started(tmp_path)


def test_without_an_lm_the_compile_is_refused(tmp_path) -> None:
    dpes = DPES(bool_metric, runs_root=tmp_path, **RUN)
    with dspy.context(lm=None), pytest.raises(ConfigError, match="lm: no LM to run the program"):
        dpes.compile(Classifier(), trainset=records())


def test_an_lm_that_does_not_answer_fails_the_preflight_before_any_charge(tmp_path) -> None:
    class DownEngine(MoodEngine):
        def complete(self, request: Any) -> Response:
            raise ConnectionError("connection refused by 127.0.0.1:9")

    for public in (PUBLIC, None):
        with pytest.raises(PreflightError, match="public probe.*connection refused"):
            optimizer(tmp_path, lm=mood_lm(DownEngine(), num_retries=0), public_trainset=public).compile(
                Classifier(), trainset=records()
            )
    assert not any(line.strip() for p in tmp_path.rglob("ledger.jsonl") for line in p.read_text().splitlines()[1:])


def test_auto_presets_set_the_schedule_and_keywords_override_them(tmp_path) -> None:
    light = DPES(bool_metric, auto="light")
    assert {k: getattr(light.config, k) for k in AUTO_PRESETS["light"]} == AUTO_PRESETS["light"]
    heavy = DPES(bool_metric, auto="heavy", generations=2, epsilon=1.5)
    assert heavy.config.generations == 2 and heavy.config.population == AUTO_PRESETS["heavy"]["population"]
    assert heavy.config.epsilon == 1.5
    assert DPES(bool_metric, auto=None).config.generations == 6  # DPESConfig's own default


# -- 4. the adapter and the LM bridges -------------------------------------------------------------------
def test_the_completion_adapter_lays_out_a_prompt_a_base_model_continues() -> None:
    adapter = CompletionAdapter()
    signature = dspy.Signature("text -> label", "Label the mood.")
    demos = [dspy.Example(text="a good film", label="positive")]
    head, call = adapter.format(signature, demos, {"text": "a bad day"})
    # two messages (the candidate's part, then the call's inputs), one text once joined as text mode joins
    assert "\n\n".join([head["content"], call["content"]]) == (
        "Label the mood.\n\ntext: a good film\n\nBEGIN RESPONSE: positive\n\ntext: a bad day"
    )
    assert call["content"] == "text: a bad day"
    assert adapter.parse(signature, " positive") == {"label": "positive"}
    assert adapter.parse(signature, "\n\nnegative\ntext: more") == {"label": "negative"}
    assert adapter.parse(signature, "label: positive") == {"label": "positive"}
    with pytest.raises(dspy.AdapterParseError):
        adapter.parse(signature, "   ")


def test_the_completion_adapter_parses_several_and_typed_fields() -> None:
    from typing import Literal

    adapter = CompletionAdapter()
    cot = dspy.ChainOfThought("text -> person").predict.signature
    parsed = adapter.parse(cot, " The speaker is named.\nperson: Ana Ruiz\ntext: next")
    assert parsed == {"reasoning": "The speaker is named.", "person": "Ana Ruiz"}
    with pytest.raises(dspy.AdapterParseError):
        adapter.parse(cot, " no person field here")

    class Mood(dspy.Signature):
        text: str = dspy.InputField()
        label: Literal["positive", "negative"] = dspy.OutputField()

    assert adapter.parse(Mood, " negative") == {"label": "negative"}
    with pytest.raises(dspy.AdapterParseError):
        adapter.parse(Mood, " maybe")


def test_engine_lm_runs_a_dspy_program_on_a_dp_textgrad_engine() -> None:
    engine = ScriptedEngine(lambda prompt, system: " positive\ntext: more" if "good" in prompt else " negative")
    lm = EngineLM(engine)
    program = dspy.Predict("text -> label")
    with dspy.context(lm=lm, adapter=CompletionAdapter()):
        assert program(text="a good day").label == "positive"
        assert program(text="a bad day").label == "negative"
    (call, _) = engine.history
    assert call.prompt.endswith("text: a good day\n\nBEGIN RESPONSE:") and call.stop == (
        "\n\ntext:",
        "\nBEGIN RESPONSE:",
    )
    assert lm.cache is False


def test_a_dspy_lm_as_a_dp_textgrad_engine_generates_and_counts() -> None:
    engine = MoodEngine()
    as_engine = DSPyLMEngine(mood_lm(engine))
    assert as_engine.instruction_following is False
    assert "negative" in as_engine.generate("Rewrite this instruction.", max_tokens=8)
    assert as_engine.usage.calls == 1 and as_engine.usage.prompt_tokens > 0
    assert DSPyLMEngine(mood_lm(), instruction_following=True).instruction_following is True
    with pytest.raises(NotImplementedError):
        as_engine.score_choices(["x"], ["a"])  # type: ignore[arg-type]


def test_dpes_with_a_dp_textgrad_engine_runs_the_program_through_engine_lm(tmp_path) -> None:
    engine = ScriptedEngine(
        lambda prompt, system: " positive" if "good day" in prompt.rsplit("text:", 1)[-1] else " negative"
    )
    dpes = DPES(
        bool_metric,
        engine=engine,
        adapter=CompletionAdapter(),
        instruction_following=False,
        public_trainset=PUBLIC,
        runs_root=tmp_path,
        **RUN,
    )
    compiled = dpes.compile(Classifier(), trainset=records())
    assert parse_layout(dpes.outcome.result.prompt, []).compose().startswith(compiled.classify.signature.instructions)
    assert engine.history and all(call.prompt.endswith("BEGIN RESPONSE:") for call in engine.history)
    assert engine.instruction_following is True  # the user's engine is left as it is
    assert dpes.config.llm_operators is False


def test_an_engine_with_a_cache_directory_is_refused_before_any_charge(tmp_path) -> None:
    from dp_textgrad.engines.llama_support import GenerationCache

    engine = ScriptedEngine(default=" positive")
    engine.cache = GenerationCache(tmp_path / "generations")  # as LlamaCppEngine(cache=DIR) holds it
    dpes = DPES(bool_metric, engine=engine, adapter=CompletionAdapter(), runs_root=tmp_path / "runs", **RUN)
    with pytest.raises(ConfigError, match="engine: the engine keeps its generations in a cache directory"):
        dpes.compile(Classifier(), trainset=records())
    assert not (tmp_path / "runs").exists() and not (tmp_path / "generations").exists()


# -- 5. the seal around private calls: threads, logs, warnings, DSPy's response cache -----------------------
class LoggingMoodEngine(MoodEngine):
    """A client that logs and warns with the request's text, as a chatty HTTP client might."""

    def complete(self, request: Any) -> Response:
        import logging
        import warnings

        text = (request.messages[-1].text or "") if request.messages else ""
        logging.getLogger("dspy.clients.chatty").warning("sending %s", text)
        logging.getLogger("user_app").error("request: %s", text)
        warnings.warn(f"slow request: {text}", UserWarning, stacklevel=1)
        return super().complete(request)


def test_logs_and_warnings_of_private_calls_are_dropped_and_the_seal_is_taken_away(tmp_path, caplog) -> None:
    import logging
    import warnings

    private = [example(f"{SECRET} had a good day {i}", "positive") for i in range(12)]
    program = Classifier()
    lm = mood_lm(LoggingMoodEngine())
    with caplog.at_level(logging.INFO), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        show = warnings.showwarning
        optimizer(tmp_path, lm=lm, dataset_size=12, num_threads=3).compile(program, trainset=private)
        assert warnings.showwarning is show
        assert SECRET not in caplog.text and not any(SECRET in str(w.message) for w in caught)
        assert not any(logging.getLogger(name).filters for name in ("dspy.clients.chatty", "user_app", "dspy"))
        assert not logging.getLogger().filters
        with dspy.context(lm=lm):  # control: outside DPES the same program logs and warns the record
            program(text=private[0].text)
        assert SECRET in caplog.text and any(SECRET in str(w.message) for w in caught)


def test_private_calls_never_use_dspys_response_cache(tmp_path, monkeypatch) -> None:
    from dspy.clients.cache import Cache

    class RecordingCache(Cache):
        def __init__(self) -> None:
            super().__init__(enable_disk_cache=False, enable_memory_cache=True, disk_cache_dir=None)
            self.requests: list[Any] = []

        def put(self, request: Any, value: Any, *args: Any, **kwargs: Any) -> None:
            self.requests.append(request)
            super().put(request, value, *args, **kwargs)

        def get(self, request: Any, *args: Any, **kwargs: Any) -> Any:
            self.requests.append(request)
            return super().get(request, *args, **kwargs)

    cache = RecordingCache()
    monkeypatch.setattr(dspy, "cache", cache)
    lm = mood_lm(cache=True)
    program = Classifier()
    program.classify.config["cache"] = True  # a per-call setting would override the LM's
    optimizer(tmp_path, lm=lm).compile(program, trainset=records())
    assert cache.requests == []
    with dspy.context(lm=lm):  # control: DSPy caches the same program's calls outside DPES
        program(text="a good day")
    assert cache.requests


def test_threads_score_records_apart_with_the_same_result(tmp_path) -> None:
    prompts = []
    for threads in (1, 4):
        dpes = optimizer(tmp_path / str(threads), num_threads=threads)
        dpes.compile(Classifier(), trainset=records())
        prompts.append(dpes.outcome.result.prompt)
    assert prompts[0] == prompts[1]  # seeded noise and sampling: threads change nothing


def test_a_predictor_with_its_own_lm_runs_on_a_sealed_copy_of_it(tmp_path) -> None:
    own, default = MoodEngine(), MoodEngine()
    own_lm = mood_lm(own, cache=True)
    program = Classifier()
    program.classify.lm = own_lm
    dpes = optimizer(tmp_path, lm=mood_lm(default))
    compiled = dpes.compile(program, trainset=records())
    assert own.calls > 0 and default.calls == 0  # the predictor's own LM answered, as in the user's program
    assert own_lm.history == [] and own_lm.cache is True  # the user's LM is left as it is; a copy ran
    assert compiled.classify.lm is not None and "outcome" not in dpes.get_params()
