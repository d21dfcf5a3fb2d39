"""DSPy programs as people write them (issue 49): every predictor of a program in one compile,
demonstrations in ``predictor.demos``, a plan before the compile, nothing in the working directory,
privacy-off programs that save and load, and another optimizer's arguments pointed to ours."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest

dspy = pytest.importorskip("dspy", reason="needs the [dspy] extra: pip install 'dp-textgrad[dspy]'")

from dp_textgrad import runs  # noqa: E402
from dp_textgrad.dp_es.config import ConfigError  # noqa: E402
from dp_textgrad.integrations.dspy import DPES, CompletionAdapter, DPGuarantee  # noqa: E402
from dp_textgrad.integrations.dspy.optimizer import FOREIGN_ARGUMENTS  # noqa: E402
from dp_textgrad.tasks.components import split_components  # noqa: E402
from tests.dp_es.test_generation_privacy import charges, planned_atoms  # noqa: E402
from tests.integrations.test_dspy_optimizer import (  # noqa: E402
    PUBLIC,
    RUN,
    Classifier,
    MoodEngine,
    bool_metric,
    mood_lm,
    optimizer,
    records,
)


class Pipeline(dspy.Module):
    """Two predictors in a row: a draft label, then a final label from the text and the draft."""

    def __init__(self) -> None:
        super().__init__()
        self.draft = dspy.Predict("text -> label")
        self.final = dspy.Predict("text -> label")

    def forward(self, text: str) -> Any:
        draft = self.draft(text=text)
        return self.final(text=f"{text} (first guess: {draft.label})")


PARTS = ["draft", "final"]


def test_every_predictor_of_a_program_is_optimized_one_part_per_child(tmp_path) -> None:
    engine = MoodEngine()
    dpes = optimizer(tmp_path, lm=mood_lm(engine), generations=3, population=4)
    student = Pipeline()
    compiled = dpes.compile(student, trainset=records())
    outcome = dpes.outcome
    assert outcome is not None and engine.calls > 0
    released = split_components(outcome.result.prompt, PARTS)  # one text per predictor
    archive = {c.id: c for c in outcome.optimizer.population.archive}
    changed_parts = set()
    for child in archive.values():
        if not child.parent_ids or child.parent_ids[0] not in archive:
            continue
        mine = split_components(child.text, PARTS)
        theirs = split_components(archive[child.parent_ids[0]].text, PARTS)
        changed = [name for name in PARTS if mine[name] != theirs[name]]
        assert changed == [child.operator_meta["component"]]
        changed_parts.update(changed)
    assert changed_parts == set(PARTS)
    search = [c for c in charges(outcome.run_dir) if c["label"].startswith(("generation ", "final "))]
    assert search and [c["event"] for c in search] == planned_atoms(outcome.run_dir)
    # both predictors of the compiled program hold their released instruction (and public demos only)
    for name in PARTS:
        predictor = getattr(compiled, name)
        assert predictor.signature.instructions.strip() in released[name]
        assert all(any(demo is e for e in PUBLIC) for demo in predictor.demos)
    assert compiled.dp_guarantee.optimized == "draft, final"
    assert student.draft.demos == [] and student.final.signature.instructions == Pipeline().final.signature.instructions


def test_a_multi_predictor_program_saves_and_loads_with_its_guarantee(tmp_path) -> None:
    compiled = optimizer(tmp_path / "runs").compile(Pipeline(), trainset=records())
    path = tmp_path / "program.json"
    compiled.save(str(path))
    fresh = Pipeline()
    fresh.load(str(path))
    for name in PARTS:
        assert getattr(fresh, name).signature.instructions == getattr(compiled, name).signature.instructions
    assert DPGuarantee.of(fresh) == compiled.dp_guarantee
    assert str(tmp_path) not in path.read_text()  # the guarantee carries no local path


def test_one_named_predictor_leaves_the_others_as_they_are(tmp_path) -> None:
    student = Pipeline()
    dpes = optimizer(tmp_path, predictor="final")
    compiled = dpes.compile(student, trainset=records())
    assert compiled.draft.signature.instructions == student.draft.signature.instructions
    assert "[[" not in dpes.outcome.result.prompt and compiled.dp_guarantee.optimized == "final"
    with pytest.raises(ConfigError, match="predictor: no predictor named 'nope'"):
        optimizer(tmp_path, predictor=["final", "nope"]).compile(Pipeline(), trainset=records())


def test_a_compile_with_default_arguments_leaves_the_working_directory_unchanged(tmp_path, monkeypatch) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    home = tmp_path / "home"
    monkeypatch.setenv(runs.HOME_ENV, str(home))
    settings = {k: v for k, v in RUN.items()}
    dpes = DPES(bool_metric, lm=mood_lm(), public_trainset=PUBLIC, **settings)  # no run_dir, no runs_root
    dpes.compile(Classifier(), trainset=records())
    assert list(work.iterdir()) == []
    assert dpes.outcome is not None and dpes.outcome.run_dir.parent == home / "runs"
    assert (home / "runs" / "operator").is_dir()  # the lifetime store lives there, and lasts


def test_the_default_runs_root_is_the_users_data_folder(monkeypatch) -> None:
    monkeypatch.delenv(runs.HOME_ENV, raising=False)
    import platformdirs

    assert runs.default_runs_root() == platformdirs.user_data_path("dp-textgrad") / "runs"
    monkeypatch.setenv(runs.HOME_ENV, "~/somewhere")
    assert runs.default_runs_root() == Path(os.path.expanduser("~/somewhere")) / "runs"


def test_a_privacy_off_program_saves_loads_and_says_it_is_not_private(tmp_path) -> None:
    settings = {k: v for k, v in RUN.items() if k not in ("epsilon", "insecure_noise_seed")}
    dpes = DPES(bool_metric, lm=mood_lm(), public_trainset=PUBLIC, runs_root=tmp_path, privacy="off", **settings)
    compiled = dpes.compile(Classifier(), trainset=records())
    guarantee = compiled.dp_guarantee
    assert guarantee.differentially_private is False and guarantee.epsilon == float("inf")
    assert guarantee.epsilons == {} and "NOT differentially private" in str(guarantee)
    path = tmp_path / "off.json"
    compiled.save(str(path))
    assert json.loads(path.read_text())["classify"]["dp_guarantee"]["epsilon"] == "inf"  # strict JSON
    fresh = Classifier()
    fresh.load(str(path))
    assert DPGuarantee.of(fresh) == guarantee
    # a save made before this fix wrote epsilon null: it loads too
    old = json.loads(path.read_text())
    old["classify"]["dp_guarantee"]["epsilon"] = None
    path.write_text(json.dumps(old))
    older = Classifier()
    older.load(str(path))
    assert DPGuarantee.of(older).epsilon == float("inf")


@pytest.mark.parametrize("name", ["num_trials", "max_bootstrapped_demos", "minibatch_size", "prompt_model", "bsize"])
def test_another_optimizers_arguments_name_our_equivalent(tmp_path, name) -> None:
    with pytest.raises(ConfigError, match=f"{name}: not a DPES setting .*use "):
        DPES(bool_metric, **{name: 4})
    with pytest.raises(ConfigError, match=f"{name}: not a DPES.compile setting .*use "):
        optimizer(tmp_path).compile(Classifier(), trainset=records(), **{name: 4})
    assert not any(tmp_path.rglob("ledger.jsonl"))
    assert FOREIGN_ARGUMENTS[name] in str(pytest.raises(ConfigError, DPES, bool_metric, **{name: 4}).value)


def test_the_trainset_may_be_given_by_position(tmp_path) -> None:
    compiled = optimizer(tmp_path).compile(Classifier(), records())
    assert DPGuarantee.of(compiled) is not None


def test_the_plan_states_the_cost_before_anything_is_charged(tmp_path, capsys) -> None:
    engine = MoodEngine()
    dpes = optimizer(tmp_path, lm=mood_lm(engine), auto="light", **{"generations": 2, "population": 3})
    plan = dpes.plan(Classifier(), records())
    assert not any(tmp_path.rglob("ledger.jsonl"))  # nothing charged, no run started
    assert engine.calls == 1  # one public call, timed
    q, n, k, t = RUN["sampling_rate"], RUN["dataset_size"], 3, 2
    assert plan.epsilon <= RUN["epsilon"] + 1e-9 and plan.seconds_per_call >= 0
    printed = capsys.readouterr().out
    assert "program calls on private examples" in printed and "epsilon" in printed
    # the plan never reads how many private examples there are: without a public N it is refused
    undeclared = optimizer(tmp_path, lm=mood_lm(MoodEngine()), dataset_size=None)
    with pytest.raises(ConfigError, match="dataset_size: the plan needs a public N"):
        undeclared.plan(Classifier(), records())
    expected = undeclared.plan(Classifier(), records(), dataset_size=RUN["dataset_size"], show=False)
    assert expected.private_calls == pytest.approx(plan.private_calls)
    # the compile then spends what the plan said: its ledger is the plan's
    dpes.compile(Classifier(), trainset=records())
    assert dpes.outcome.result.epsilon == pytest.approx(plan.epsilon, rel=1e-6)
    final = any(c["label"].startswith("final ") for c in charges(dpes.outcome.run_dir))
    assert plan.private_calls == pytest.approx(q * n * k * (t + final))


def test_the_plan_counts_the_final_estimate_and_the_compile_releases_it(tmp_path) -> None:
    dpes = optimizer(tmp_path, lm=mood_lm(MoodEngine()), generations=2, population=3,
                     final_estimate={"epsilon_share": 0.2})
    plan = dpes.plan(Classifier(), records(), show=False)
    q, n, k, t = RUN["sampling_rate"], RUN["dataset_size"], 3, 2
    assert plan.private_calls == pytest.approx(q * n * k * t + min(1.0, k * q) * n)
    dpes.compile(Classifier(), trainset=records())
    assert charges(dpes.outcome.run_dir)[-1]["label"].startswith("final estimate")
    assert [c["event"] for c in charges(dpes.outcome.run_dir)] == planned_atoms(dpes.outcome.run_dir)
    assert dpes.outcome.result.final_estimate is not None
    assert dpes.outcome.result.epsilon == pytest.approx(plan.epsilon, rel=1e-6)


def test_the_presets_scale_the_sampling_rate_with_the_trainset() -> None:
    light = DPES(bool_metric, auto="light")
    assert light.config.sampling_rate == 0.25  # a share of N: half the examples, half the calls


def test_progress_is_a_bar_and_log_lines_of_released_values(tmp_path, caplog, capsys) -> None:
    with caplog.at_level(logging.INFO, logger="dp_textgrad.integrations.dspy"):
        optimizer(tmp_path, progress=True).compile(Classifier(), trainset=records())
    lines = [r.getMessage() for r in caplog.records if r.name == "dp_textgrad.integrations.dspy"]
    assert sum("generation" in line and "best noisy estimate" in line for line in lines) == RUN["generations"]
    assert "DPES compile" in capsys.readouterr().err  # the bar
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="dp_textgrad.integrations.dspy"):
        optimizer(tmp_path, progress=False).compile(Classifier(), trainset=records())
    assert not [r for r in caplog.records if r.name == "dp_textgrad.integrations.dspy"]


def test_the_completion_adapter_renders_field_descriptions() -> None:
    class Route(dspy.Signature):
        """Extract the route."""

        request: str = dspy.InputField(desc="a customer's flight request")
        route: str = dspy.OutputField(desc='"from X to Y"')
        note: str = dspy.OutputField()

    content = "\n\n".join(m["content"] for m in CompletionAdapter().format(Route, [], {"request": "fly me to Oslo"}))
    assert "Input request: a customer's flight request" in content and 'Output route: "from X to Y"' in content
    assert "Output note" not in content  # no desc= given: nothing said
    assert content.index("Extract the route.") < content.index("Input request:") < content.index("request: fly")


def test_engine_lm_generates_after_the_cached_prefix_the_same_text(llama_engine) -> None:
    """A completion call of several messages goes through ``generate_after_prefix`` (the candidate's
    instruction and demonstrations decoded once and kept), and answers what one ``generate`` of the
    whole text answers."""
    from dp_textgrad.integrations.dspy import EngineLM

    adapter = CompletionAdapter()
    program = dspy.Predict(dspy.Signature("text -> label", "Label the mood of the text: positive or negative."))
    program.demos = [
        dspy.Example(text="a good film", label="positive"),
        dspy.Example(text="a bad film", label="negative"),
    ]
    calls: list[str] = []
    original = llama_engine.generate_after_prefix

    def counted(prefix, suffixes, **kwargs):
        calls.append(prefix)
        return original(prefix, suffixes, **kwargs)

    llama_engine.generate_after_prefix = counted
    try:
        answers = {}
        for reuse in (True, False):
            lm = EngineLM(llama_engine, max_tokens=4, reuse_prefix=reuse)
            with dspy.context(lm=lm, adapter=adapter):
                answers[reuse] = [program(text=t).label for t in ("a lovely day", "an awful day", "a fine meal")]
    finally:
        del llama_engine.generate_after_prefix
    assert len(calls) == 3 and len(set(calls)) == 1  # one prefix for every record of the candidate
    assert answers[True] == answers[False]
