"""The labelling phase inside a run (dp.labelling): planned with the search, charged once, never again."""

from __future__ import annotations

import dataclasses
import json
import math
import warnings
from pathlib import Path

import dp_accounting
import pytest
from dp_textgrad.privacy.accounting.serialize import event_to_dict
from hypothesis import given, settings
from hypothesis import strategies as st

from dp_textgrad._textgrad import import_textgrad
from dp_textgrad.dp_es import labelling_phase
from dp_textgrad.dp_es.config import ConfigError, DPESConfig, LabellingConfig, default_teachers
from dp_textgrad.dp_es.optimizer import DPEvolutionStrategy
from dp_textgrad.dp_es.plan import RunPlan
from tests.helpers import ExactRuleEngine, RuleEngine, make_records, make_task

tg = import_textgrad()
POOL = [example.text for example in make_records(24, seed=77)]


def labelled_task(n_private: int = 120, pool=POOL):
    return dataclasses.replace(make_task(n_private), public_examples=[], public_inputs=list(pool))


def prompt_of(task):
    return tg.Variable(task.seed_prompt, role_description="system prompt", requires_grad=True)


def build(task, run_dir=None, **settings):
    options = dict(epsilon=2.0, dataset_size=len(task.private_train), generations=2, population=3, parents=1,
                   labelling={"teachers": 6, "queries": 8}, insecure_noise_seed=3)
    options.update(settings)
    return DPEvolutionStrategy([prompt_of(task)], task=task, engine=ExactRuleEngine(), checkpoint_dir=run_dir, **options)


def ledger_lines(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "ledger.jsonl").read_text().splitlines()[1:]]


def planned_atoms(run_dir: Path, num_labels: int) -> list[dict]:
    """The plan's events in charge order, rebuilt from the released config and checkpoint alone."""
    config = DPESConfig(**json.loads((run_dir / "checkpoint.json").read_text())["config"])
    plan = RunPlan.with_value(config, json.loads((run_dir / "checkpoint.json").read_text())["plan_value"])
    labelling = plan.labelling(num_labels)
    atoms = [] if labelling is None else list(labelling.events())
    return [event_to_dict(event) for event in atoms + plan.charges()]


# -- the ledger is the plan, the labelling first ------------------------------------------------------
@pytest.mark.parametrize("extra", [{}, {"final_selection": "exponential"},
                                   {"labelling": {"teachers": 6, "queries": 8, "threshold": 4.0,
                                                  "threshold_sigma": 20.0}}])
def test_the_ledger_equals_the_plan_atom_for_atom(tmp_path: Path, extra) -> None:
    task = labelled_task()
    opt = build(task, tmp_path / "run", **extra)
    result = opt.run()
    lines = ledger_lines(tmp_path / "run")
    assert [line["label"] for line in lines].count("labelling") == 1
    assert lines[0]["label"] == "labelling"
    assert [line["event"] for line in lines] == planned_atoms(tmp_path / "run", len(task.labels))
    assert result.epsilon <= 2.0 + 1e-9
    # The plan composes labelling and search the way the ledger does.
    planned = min(opt.plan.epsilons(opt.config.resolved_delta).values())
    assert math.isclose(result.epsilon, planned, rel_tol=1e-6)


def test_a_counted_n_comes_first_and_sets_the_default_teachers(tmp_path: Path) -> None:
    task = labelled_task(200)
    opt = build(task, tmp_path / "run", dataset_size=None, labelling={"queries": 8})
    opt.run()
    labels = [line["label"] for line in ledger_lines(tmp_path / "run")]
    assert labels[:2] == ["dataset size: DP count", "labelling"]
    assert opt.config.labelling.teachers == default_teachers(opt.config.counted_dataset_size)
    assert opt.ledger.epsilon() <= 2.0 + 1e-9


# -- what the search gets -------------------------------------------------------------------------------
def test_dp_labelled_examples_become_the_demonstrations_of_generation_zero(tmp_path: Path) -> None:
    task = labelled_task()
    opt = build(task, tmp_path / "run", epsilon=200.0, generations=1)  # little noise: the vote is the majority
    opt.step()
    labelled = opt.labelled
    assert labelled is not None and labelled.answered == 8
    texts = {example.text for example in labelled.examples}
    assert all(text in POOL[:8] for text in texts)
    assert opt.task.public_examples == list(labelled.examples)
    assert any(any(text in c.text for text in texts) for c in opt.population.candidates), "structured start"
    # RuleEngine's teachers vote the label a record's text names, so most labels are right here.
    truth = {example.text: example.label for example in make_records(24, seed=77)}
    right = sum(truth[e.text] == e.label for e in labelled.examples)
    assert right >= 5
    saved = json.loads((tmp_path / "run" / "labels.json").read_text())
    assert saved["examples"] == [{"text": e.text, "label": e.label} for e in labelled.examples]
    assert saved["inputs"] == POOL[:8] and saved["queries"] == 8 and saved["teachers"] == 6


def test_the_result_carries_the_release(tmp_path: Path) -> None:
    opt = build(labelled_task(), tmp_path / "run")
    result = opt.run()
    saved = json.loads((tmp_path / "run" / "labels.json").read_text())
    assert result.labelling == saved
    assert result.labelling["epsilon_share"] == 0.5
    assert result.labelling["epsilon"] <= 0.5 * 2.0 + 1e-9


# -- resuming never labels again ------------------------------------------------------------------------
def test_a_resumed_run_reads_its_labels_back_and_is_never_charged_again(tmp_path: Path) -> None:
    task = labelled_task()
    run_dir = tmp_path / "run"
    first = build(task, run_dir, callbacks=[lambda report: True])
    first.run()
    labels = first.labelled
    engine = ExactRuleEngine()
    resumed = DPEvolutionStrategy.resume(run_dir, [prompt_of(task)], task=task, engine=engine)
    assert resumed.labelled == labels
    assert resumed.task.public_examples == list(labels.examples)
    result = resumed.run()
    lines = ledger_lines(run_dir)
    assert [line["label"] for line in lines].count("labelling") == 1
    assert [line["event"] for line in lines] == planned_atoms(run_dir, len(task.labels))
    assert result.labelling["examples"] == [{"text": e.text, "label": e.label} for e in labels.examples]


def test_a_run_stopped_between_the_charge_and_the_labels_goes_on_without_them(tmp_path: Path, monkeypatch) -> None:
    task = labelled_task()
    run_dir = tmp_path / "run"
    opt = build(task, run_dir)

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(labelling_phase, "write_labels", killed)
        with pytest.raises(KeyboardInterrupt):
            opt.step()
    assert [line["label"] for line in ledger_lines(run_dir)] == ["labelling"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed = DPEvolutionStrategy.resume(run_dir, [prompt_of(task)], task=task, engine=ExactRuleEngine())
    assert any("labels were not saved" in str(w.message) for w in caught)
    assert resumed.interrupted_charges == 0  # the phase's charge is not an interrupted generation's
    result = resumed.run()
    labels = [line["label"] for line in ledger_lines(run_dir)]
    assert labels.count("labelling") == 1 and labels[0] == "labelling"
    assert result.labelling is None
    assert [line["event"] for line in ledger_lines(run_dir)] == planned_atoms(run_dir, len(task.labels))


# -- refused before any charge --------------------------------------------------------------------------
def test_too_few_public_inputs_are_refused_before_any_charge(tmp_path: Path) -> None:
    task = labelled_task(pool=POOL[:3])
    with pytest.raises(ConfigError, match=r"dp.labelling.queries: 8 inputs .* 3 public inputs"):
        build(task, tmp_path / "run")
    assert not (tmp_path / "run" / "ledger.jsonl").exists() or ledger_lines(tmp_path / "run") == []


def test_no_public_inputs_are_refused_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="task.public_inputs"):
        build(labelled_task(pool=[]), tmp_path / "run")


def test_a_generation_task_without_public_inputs_is_refused_naming_them() -> None:
    from dp_textgrad.tasks.registry import get_task

    task = get_task("support_extract")
    with pytest.raises(ConfigError, match="task.public_inputs: dp.labelling needs public unlabelled inputs"):
        DPEvolutionStrategy([prompt_of(task)], task=task, engine=ExactRuleEngine(), dataset_size=50,
                            labelling={"teachers": 4})


def test_a_generation_task_refuses_an_engine_that_cannot_list_its_next_tokens() -> None:
    from dp_textgrad.tasks.registry import get_task

    task = get_task("support_extract", public_inputs=4)
    with pytest.raises(ConfigError, match="cannot list next tokens"):
        DPEvolutionStrategy([prompt_of(task)], task=task, engine=ExactRuleEngine(), dataset_size=50,
                            labelling={"teachers": 4})
    # The span vote asks for the input's tokens only.
    with pytest.raises(ConfigError, match=r"cannot list a text's tokens \(text_pieces\)"):
        DPEvolutionStrategy([prompt_of(task)], task=task, engine=ExactRuleEngine(), dataset_size=50,
                            labelling={"teachers": 4, "vote": "span"})


@pytest.mark.parametrize("key", [{"threshold": 4.0, "threshold_sigma": 20.0}])
def test_a_generation_task_refuses_confident_gnmax(key) -> None:
    from dp_textgrad.engines.scripted import ScriptedEngine
    from dp_textgrad.tasks.registry import get_task

    task = get_task("support_extract", public_inputs=4)
    with pytest.raises(ConfigError, match="dp.labelling.threshold: confident GNMax labels classification tasks"):
        DPEvolutionStrategy([prompt_of(task)], task=task, engine=ScriptedEngine(), dataset_size=50,
                            labelling={"teachers": 4, **key})


@pytest.mark.parametrize("key", ["max_answer_tokens", "sampling_rate", "candidates"])
def test_a_classification_task_refuses_the_answer_keys_naming_them(key) -> None:
    value = {"max_answer_tokens": 8, "sampling_rate": 0.5, "candidates": 4}[key]
    with pytest.raises(ConfigError, match=f"dp.labelling.{key}: applies to generation tasks"):
        build(labelled_task(), labelling={"teachers": 6, "queries": 8, key: value})


def test_privacy_off_refuses_a_labelling_phase() -> None:
    with pytest.raises(ConfigError, match="privacy 'off' has none"):
        build(labelled_task(), privacy="off")


def test_bad_labelling_settings_name_the_field() -> None:
    with pytest.raises(ValueError, match="epsilon_share must be in"):
        LabellingConfig(epsilon_share=1.0)
    with pytest.raises(ValueError, match="threshold, threshold_sigma: give both"):
        LabellingConfig(threshold=5.0)
    with pytest.raises(ValueError, match="teachers"):
        LabellingConfig(teachers=1)


# -- the plan: never over the target, and the labelling costs the search something ---------------------
def _plan(epsilon: float, share: float | None, queries: int = 16) -> RunPlan:
    labelling = None if share is None else {"teachers": 50, "queries": queries, "epsilon_share": share}
    config = DPESConfig(epsilon=epsilon, dataset_size=2000, generations=3, population=4, labelling=labelling)
    return RunPlan.calibrated(config.resolved())


@settings(max_examples=6, deadline=None)
@given(epsilon=st.sampled_from([0.5, 1.0, 4.0]), share=st.floats(0.1, 0.8), queries=st.integers(1, 64))
def test_the_calibrated_plan_never_exceeds_the_target(epsilon: float, share: float, queries: int) -> None:
    plan = _plan(epsilon, share, queries)
    delta = plan.config.resolved_delta
    assert min(plan.epsilons(delta).values()) <= epsilon
    assert min(plan.labelling_epsilons(delta).values()) <= share * epsilon
    # The stage event the ledger will compose, checked with dp-accounting's PLD directly.
    pld = dp_accounting.pld.PLDAccountant(dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    assert pld.compose(plan.stage_event).get_epsilon(delta) <= epsilon * (1 + 1e-6)


def test_a_larger_share_gives_less_vote_noise_and_more_search_noise() -> None:
    plans = [_plan(1.0, share) for share in (0.2, 0.5, 0.8)]
    sigmas = [plan.labelling_sigma for plan in plans]
    values = [plan.value for plan in plans]
    assert sigmas[0] > sigmas[1] > sigmas[2]
    assert _plan(1.0, None).value < values[0] < values[1] < values[2]


def test_the_remaining_event_includes_a_labelling_not_yet_run(tmp_path: Path) -> None:
    opt = build(labelled_task(), tmp_path / "run")
    before = opt.remaining_event()
    assert isinstance(before, dp_accounting.ComposedDpEvent) and before.events[0] == opt.plan.labelling_event
    opt.step()
    assert opt.remaining_event() == opt.plan.remaining_event(1)


def test_a_vote_drowned_in_noise_is_warned_about_from_public_values() -> None:
    assert labelling_phase.noise_warning(39.8, 10) is not None  # the noise swamps 10 votes
    assert labelling_phase.noise_warning(11.3, 100) is None
    assert labelling_phase.noise_warning(None, 10) is None
    assert "epsilon_share" in labelling_phase.noise_warning(6.0, 4)


def test_a_bad_pool_is_refused_before_the_count_of_n_is_charged(tmp_path: Path) -> None:
    task = labelled_task(pool=POOL[:3])
    with pytest.raises(ConfigError, match="dp.labelling.queries"):
        build(task, tmp_path / "run", dataset_size=None)
    assert not (tmp_path / "run" / "ledger.jsonl").exists() or ledger_lines(tmp_path / "run") == []


def test_an_engine_without_independent_scores_is_refused_before_the_count_of_n(tmp_path: Path) -> None:
    # A teacher's vote must depend on its own records only; an engine that does not declare that
    # its scores are independent of earlier calls (a server with a prefix cache) is refused (issue 47).
    class CachingServer(ExactRuleEngine):
        deterministic_scores = False

    task = labelled_task()
    with pytest.raises(ConfigError, match="labelling: the engine CachingServer does not declare"):
        DPEvolutionStrategy([prompt_of(task)], task=task, engine=CachingServer(), checkpoint_dir=tmp_path / "run",
                            epsilon=2.0, generations=2, population=3, parents=1,
                            labelling={"teachers": 6, "queries": 8}, insecure_noise_seed=3)
    assert not (tmp_path / "run" / "ledger.jsonl").exists() or ledger_lines(tmp_path / "run") == []
    assert ExactRuleEngine.deterministic_scores  # the engine the other tests label with declares it


def test_a_refused_labelling_charge_stops_the_run_like_a_generation(tmp_path: Path, monkeypatch) -> None:
    from dp_textgrad.privacy.accounting.ledger import BudgetExceeded

    opt = build(labelled_task(), tmp_path / "run")
    spend = opt.ledger.spend

    def refuse_the_vote(event, label, metadata=None):
        if label == "labelling":  # as the dataset's lifetime cap would
            raise BudgetExceeded(label, 9.0, 2.0, opt.ledger.delta)
        return spend(event, label, metadata)

    monkeypatch.setattr(opt.ledger, "spend", refuse_the_vote)
    calls_before = opt.engine.score_calls
    assert opt.step() is None
    assert opt.stopped_because is not None and "generation 1 of 2" in opt.stopped_because
    assert opt.labelled is None and opt.ledger.entries == []
    assert opt.engine.score_calls == calls_before + 1  # the preflight's public probe only: no teacher voted
