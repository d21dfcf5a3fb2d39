"""The DP-ES controller end to end with the tests-only ScriptedEngine."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import dp_accounting
import pytest

from dp_textgrad import BudgetExceeded, ConfigError, DPEvolutionStrategy
from dp_textgrad._textgrad import import_textgrad
from dp_textgrad.privacy.accounting import default_accountants
from dp_textgrad.dp_es.config import DPESConfig
from dp_textgrad.privacy.data import PrivateScoringError
from dp_textgrad.dp_es.plan import RunPlan
from dp_textgrad.privacy.accounting.events import GumbelTopKDpEvent, PureDpEvent, group_events
from dp_textgrad.privacy.data import PrivateDataset
from dp_textgrad.engines.scripted import ScriptedEngine
from dp_textgrad.tasks.base import ClassificationTask, Example
from dp_textgrad.tasks.synthetic import make_support_task
from tests.helpers import SUPPORT_CUES, support_cue_rule

tg = import_textgrad()

CUES, cue_rule = SUPPORT_CUES, support_cue_rule


@pytest.fixture(scope="module")
def task() -> ClassificationTask:
    return make_support_task(seed=3, n_private=300, n_test=60)


def make_engine() -> ScriptedEngine:
    return ScriptedEngine(
        responses=["Label the message with one of: bill, tech, cancel, fraud, update.</PROMPT>",
                   "Read the customer message carefully and name its main request.</PROMPT>"],
        choice_rule=cue_rule,
    )


def test_cue_rule_speaks_the_task_labels(task) -> None:
    """The scripted "model" must score the support task's own verbalisers, or the runs below
    would optimise against a flat rule; listing the labels must beat the seed prompt."""
    assert set(CUES) == set(task.verbalizers.values())
    listed = "Label the message with one of: bill, tech, cancel, fraud, update."
    assert task.accuracy(make_engine(), listed) > task.accuracy(make_engine(), task.seed_prompt) + 0.1


def make_opt(task, tmp_path=None, **settings) -> tuple[DPEvolutionStrategy, object]:
    prompt = tg.Variable(task.seed_prompt, role_description="instruction", requires_grad=True)
    # N declared (the synthetic task's size is public): these tests are about the search; the DP count
    # of an undeclared N is tested in test_dataset_size.py and in test_ledger_equals_the_planned_event.
    defaults = dict(epsilon=3.0, generations=3, population=4, parents=2, sampling_rate=0.3,
                    insecure_noise_seed=7, seed=1, dataset_size=300)
    defaults.update(settings)
    opt = DPEvolutionStrategy([prompt], task=task, engine=make_engine(), checkpoint_dir=tmp_path, **defaults)
    return opt, prompt


def test_full_run_stays_within_budget_and_updates_variable(task) -> None:
    opt, prompt = make_opt(task)
    reports = [opt.step() for _ in range(opt.generations)]
    assert all(r is not None for r in reports)
    assert opt.step() is None and opt.stopped_because == "all generations done"
    assert len(opt.ledger.entries) == 3
    spent = opt.privacy_spent()
    assert spent["epsilon"] <= 3.0 + 1e-9
    assert spent["epsilon"] > 2.5  # the calibration uses the budget, it does not waste it
    assert set(spent["by_accountant"]) == {"rdp", "pld", "drv", "kov", "basic"}
    assert spent["epsilon"] == min(spent["by_accountant"].values())
    assert prompt.value == opt.population.best(1)[0].text
    result = opt.finalise()
    assert result.prompt == prompt.value
    assert not result.unsafe and result.lineage


@pytest.mark.parametrize("settings", [
    {},
    {"feedback": "none", "final_selection": "permute_and_flip", "final_epsilon": 0.2},
    {"selection": "exponential", "feedback": "none", "final_selection": "exponential", "final_epsilon": 0.2},
    {"selection": "permute_and_flip", "feedback": "none"},
    {"llm_operators": False},
    {"dataset_size": None},
    {"dataset_size": None, "selection": "permute_and_flip", "feedback": "none", "final_selection": "exponential",
     "final_epsilon": 0.2},
], ids=["gaussian+feedback", "gaussian+final-pf", "exponential", "permute-and-flip", "feedback-unread",
        "size-counted", "size-counted+pf"])
def test_ledger_equals_the_planned_event(task, settings) -> None:
    opt, _ = make_opt(task, **settings)
    opt.run()
    # Same atoms with the same counts, not just the same epsilon: the plan is what ran (the DP count
    # of N first when N is not declared).
    assert group_events(opt.ledger.events) == group_events([opt.plan.event])
    assert (opt.plan.size_count is not None) == (settings.get("dataset_size", 300) is None)
    # The ledger's bounds are the plan's: the count's pure epsilon plus the search's (two stages).
    assert opt.ledger.epsilons() == pytest.approx(opt.plan.epsilons(opt.config.delta), rel=1e-6)
    planned = opt.plan.event
    delta = opt.config.delta
    for accountant in default_accountants():
        assert accountant.epsilon(opt.ledger.events, delta) == pytest.approx(
            accountant.epsilon([planned], delta), rel=1e-6, abs=1e-6)


def test_feedback_is_charged_only_where_it_is_read(task) -> None:
    read, unread = make_opt(task, llm_operators=True)[0], make_opt(task, llm_operators=False)[0]
    read.run()
    unread.run()
    z_fb = [e.metadata["feedback_noise_multiplier"] for e in read.ledger.entries]
    assert z_fb[:-1] == [read.noise_multiplier * read.config.feedback_noise_ratio] * 2 and z_fb[-1] is None
    assert all(e.metadata["feedback_noise_multiplier"] is None for e in unread.ledger.entries)
    # Same budget, less to pay for: the run without feedback gets less noise on its scores.
    assert unread.noise_multiplier < read.noise_multiplier


def test_the_feedback_matrix_describes_the_top_parent(task, monkeypatch) -> None:
    opt, _ = make_opt(task, llm_operators=True, generations=4)
    released, parents = [], []
    score, run = opt.scorer.score, opt.parts.run
    monkeypatch.setattr(opt.scorer, "score", lambda *a, **k: released.append(score(*a, **k)) or released[-1])
    monkeypatch.setattr(opt.parts, "run", lambda *a, **k: parents.append(run(*a, **k).parents) or None)
    opt.initialise_population()
    for t in range(3):
        opt.parts.run(t)
    for scores, chosen in zip(released, parents):
        assert scores.confusion_candidate_ids == [chosen[0].id]  # chosen from released scores: always used


def test_calibration_fits_budget_for_both_selections(task) -> None:
    for selection, feedback in (("gaussian", "dp_confusion"), ("gaussian", "none"), ("exponential", "none"),
                                ("permute_and_flip", "none")):
        config = DPESConfig(epsilon=2.0, delta=1e-5, generations=4, population=5, parents=2,
                            sampling_rate=0.2, selection=selection, feedback=feedback)
        plan = RunPlan.calibrated(config)
        spent = min(a.epsilon([plan.event], 1e-5) for a in default_accountants())
        assert spent <= 2.0 + 1e-9
        assert spent > 1.9


def test_exponential_selection_charges_gumbel_events(task) -> None:
    opt, prompt = make_opt(task, selection="exponential", feedback="none")
    result = opt.run()
    assert result.generations_run == 3
    inner = [e.event for e in opt.ledger.events]
    assert all(isinstance(e, GumbelTopKDpEvent) and e.k == 2 for e in inner)
    assert opt.ledger.epsilon() <= 3.0 + 1e-9
    assert prompt.value == result.prompt


def test_permute_and_flip_is_selectable_and_charges_pure_events(task) -> None:
    opt, prompt = make_opt(task, selection="permute_and_flip", feedback="none")
    result = opt.run()
    assert result.generations_run == 3
    inner = [e.event for e in opt.ledger.events]  # k = 2 peeled picks on one subsample each generation
    assert all(e == dp_accounting.ComposedDpEvent([PureDpEvent(opt.selection_epsilon)] * 2) for e in inner)
    assert all(entry.metadata["mechanism"] == "permute_and_flip" for entry in opt.ledger.entries)
    assert opt.ledger.epsilon() <= 3.0 + 1e-9
    assert prompt.value == result.prompt


def test_final_exponential_release_is_charged(task) -> None:
    opt, _ = make_opt(task, final_selection="exponential", final_epsilon=0.3)
    opt.run()
    assert len(opt.ledger.entries) == 4
    assert "final release" in opt.ledger.entries[-1].label
    assert opt.ledger.epsilon() <= 3.0 + 1e-9


def test_budget_refusal_reads_no_data(task) -> None:
    opt, _ = make_opt(task)
    # Someone else already spent most of this ledger: the next generation cannot fit.
    opt.ledger.spend(dp_accounting.GaussianDpEvent(1.6), "earlier release")
    calls_before = opt.engine.usage.calls
    entries_before = len(opt.ledger.entries)
    assert opt.step() is None
    assert opt.stopped_because.startswith("budget exhausted")
    assert len(opt.ledger.entries) == entries_before
    # Only the initial population's mutation calls may have happened, no scoring call.
    scoring_calls = [c for c in opt.engine.history if "Message:" in c.prompt]
    assert not scoring_calls
    assert opt.engine.usage.calls >= calls_before
    with pytest.raises(BudgetExceeded):
        opt.finalise()


def test_checkpoint_and_resume_keep_the_ledger(task, tmp_path: Path) -> None:
    opt, _ = make_opt(task, tmp_path, generations=4)
    opt.step()
    opt.step()
    spent = opt.ledger.epsilon()
    saved = json.loads((tmp_path / "checkpoint.json").read_text())
    assert saved["generation"] == 2
    prompt = tg.Variable("anything", role_description="instruction", requires_grad=True)
    resumed = DPEvolutionStrategy.resume(tmp_path, [prompt], task=task, engine=make_engine())
    assert resumed.generation == 2
    assert len(resumed.ledger.entries) == 2
    assert resumed.ledger.epsilon() == pytest.approx(spent, rel=1e-9)
    assert prompt.value == opt.variable.value
    assert [c.id for c in resumed.population.candidates] == [c.id for c in opt.population.candidates]
    result = resumed.run()
    assert result.generations_run == 4
    assert len(resumed.ledger.entries) == 4
    assert resumed.ledger.epsilon() > spent
    assert resumed.ledger.epsilon() <= 3.0 + 1e-9
    lines = (tmp_path / "ledger.jsonl").read_text().strip().splitlines()
    assert len(lines) >= 4


def test_resume_reads_the_plan_back_and_never_recalibrates(task, tmp_path: Path, monkeypatch) -> None:
    opt, _ = make_opt(task, tmp_path, generations=3)
    opt.step()
    from dp_textgrad.dp_es import plan as plan_module

    def no_calibration(*args, **kwargs):
        raise AssertionError("resume recalibrated")

    monkeypatch.setattr(plan_module, "_calibrated_value", no_calibration)
    prompt = tg.Variable("anything", role_description="instruction", requires_grad=True)
    resumed = DPEvolutionStrategy.resume(tmp_path, [prompt], task=task, engine=make_engine())
    assert resumed.plan == opt.plan and resumed.noise_multiplier == opt.noise_multiplier
    assert resumed.run().generations_run == 3


def test_resume_reads_a_format_1_checkpoint(task, tmp_path: Path) -> None:
    opt, _ = make_opt(task, tmp_path, generations=3)
    opt.step()
    state = json.loads((tmp_path / "checkpoint.json").read_text())
    assert state["format"] == 2
    old = {k: v for k, v in state.items() if k != "plan_value"}
    old.update(format=1, noise_multiplier=state["plan_value"], selection_epsilon=None)
    (tmp_path / "checkpoint.json").write_text(json.dumps(old))
    prompt = tg.Variable("anything", role_description="instruction", requires_grad=True)
    resumed = DPEvolutionStrategy.resume(tmp_path, [prompt], task=task, engine=make_engine())
    assert resumed.plan.value == opt.plan.value and resumed.generation == 1
    (tmp_path / "checkpoint.json").write_text(json.dumps({**state, "format": 99}))
    with pytest.raises(ConfigError, match="format: unsupported checkpoint format 99"):
        DPEvolutionStrategy.resume(tmp_path, [prompt], task=task, engine=make_engine())


def test_nothing_private_is_saved(task, tmp_path: Path) -> None:
    opt, _ = make_opt(task, tmp_path)
    opt.run()
    saved = "\n".join(p.read_text() for p in tmp_path.iterdir() if p.is_file())
    for record in task.private_train:
        text = record.unwrap().text
        assert text not in saved
        # Personal data fragments (account numbers, e-mails) never appear either.
        for token in text.split():
            if sum(ch.isdigit() for ch in token) >= 6 or "@" in token:
                assert token not in saved


def test_unsafe_mode_is_marked(task) -> None:
    opt, _ = make_opt(task, mode="unsafe")
    result = opt.run()
    assert result.unsafe
    assert math.isinf(result.epsilon)
    assert opt.ledger.unsafe
    assert any("NOT differentially private" in json.dumps(e.to_dict()) for e in opt.ledger.entries)


def test_unsafe_examples_sets_how_many_raw_records_reach_the_mutator(task) -> None:
    default, _ = make_opt(task, mode="unsafe")
    assert len(default.mutation.context.unsafe_examples) == 8
    wide, _ = make_opt(task, mode="unsafe", unsafe_examples=40)
    private = [rec.unwrap() for rec in task.private_train]
    assert len(wide.mutation.context.unsafe_examples) == 40
    assert all(ex in private for ex in wide.mutation.context.unsafe_examples)
    everything, _ = make_opt(task, mode="unsafe", unsafe_examples=10_000)  # capped at N
    assert len(everything.mutation.context.unsafe_examples) == len(task.private_train)
    public, _ = make_opt(task, unsafe_examples=40)  # ignored outside unsafe mode
    assert list(public.mutation.context.unsafe_examples) == []
    with pytest.raises((ConfigError, ValueError), match="unsafe_examples"):
        make_opt(task, mode="unsafe", unsafe_examples=0)


def test_callback_stops_the_run(task) -> None:
    prompt = tg.Variable(task.seed_prompt, role_description="instruction", requires_grad=True)
    opt = DPEvolutionStrategy([prompt], task=task, engine=make_engine(), epsilon=3.0, generations=4,
                              population=4, parents=2, sampling_rate=0.3, callbacks=[lambda r: r.generation >= 1])
    result = opt.run()
    assert result.stopped_because == "stopped by callback"
    assert result.generations_run == 2


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        (dict(epsilon=0.0), "epsilon"),
        (dict(epsilon=-1.0), "epsilon"),
        (dict(epsilon=float("nan")), "epsilon"),
        (dict(epsilon=float("inf")), "epsilon"),
        (dict(delta=0.0), "delta"),
        (dict(delta=1.0), "delta"),
        (dict(sampling_rate=0.0), "sampling_rate"),
        (dict(sampling_rate=1.5), "sampling_rate"),
        (dict(population=3, parents=4), "parents"),
        (dict(generations=0), "generations"),
        (dict(colour="blue"), "colour"),
    ],
)
def test_bad_configuration_names_the_field(task, settings, field) -> None:
    prompt = tg.Variable("x", role_description="instruction", requires_grad=True)
    with pytest.raises(ConfigError) as info:
        DPEvolutionStrategy([prompt], task=task, engine=make_engine(), **settings)
    message = str(info.value)
    assert field in message
    assert "\n" not in message


def test_large_delta_warns(task) -> None:
    prompt = tg.Variable("x", role_description="instruction", requires_grad=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        DPEvolutionStrategy([prompt], task=task, engine=make_engine(), delta=0.01, generations=1,
                            population=2, parents=1)
    assert any("delta" in str(w.message) for w in caught)


def test_empty_private_data_is_rejected() -> None:
    with pytest.raises(ValueError, match="private"):
        PrivateDataset([])


def test_budget_too_small_for_final_release(task) -> None:
    prompt = tg.Variable("x", role_description="instruction", requires_grad=True)
    with pytest.raises(ConfigError, match="epsilon"):
        DPEvolutionStrategy([prompt], task=task, engine=make_engine(), epsilon=0.05, final_selection="exponential",
                            final_epsilon=3.0, sampling_rate=1.0)


def test_works_as_textgrad_optimizer(task) -> None:
    opt, prompt = make_opt(task)
    assert isinstance(opt, tg.optimizer.Optimizer)
    opt.zero_grad()
    opt.step()
    assert isinstance(prompt.value, str) and prompt.value


def test_wrong_task_type(task) -> None:
    prompt = tg.Variable("x", role_description="instruction", requires_grad=True)
    with pytest.raises(ConfigError, match="task"):
        DPEvolutionStrategy([prompt], task=[Example("a", "b")], engine=make_engine())


def test_charge_is_on_disk_before_any_record_is_read(task, tmp_path: Path, monkeypatch) -> None:
    """A crash inside a mechanism (a scoring worker that dies) never loses its charge (resume
    cannot double-spend). Failures on single records are data instead (tests/dp_es/test_failures_are_data.py)."""
    from dp_textgrad.dp_es.scoring_backends import LocalScoring

    def worker_dies(self, *args, **kwargs):
        raise RuntimeError("scoring worker crashed")

    monkeypatch.setattr(LocalScoring, "totals", worker_dies)
    prompt = tg.Variable(task.seed_prompt, role_description="instruction", requires_grad=True)
    engine = ScriptedEngine(responses=["Label the message.</PROMPT>"])
    opt = DPEvolutionStrategy([prompt], task=task, engine=engine, checkpoint_dir=tmp_path, epsilon=3.0,
                              generations=3, population=4, parents=2, sampling_rate=0.3, use_critiques=False,
                              dataset_size=300)
    with pytest.raises(PrivateScoringError, match="scoring the private records failed") as failure:
        opt.step()
    assert "worker crashed" not in str(failure.value) and "worker crashed" in failure.value.operator_detail
    from dp_textgrad.privacy.accounting import PrivacyLedger

    on_disk = PrivacyLedger.from_jsonl(tmp_path / "ledger.jsonl")
    assert len(on_disk.entries) == 1
    assert on_disk.epsilon() == pytest.approx(opt.ledger.epsilon())
    # The checkpoint from before the first charge lets the run resume (the charge is kept).
    state = json.loads((tmp_path / "checkpoint.json").read_text())
    assert state["generation"] == 0 and state["history"] == []


def test_the_calibration_memo_keys_on_every_field_the_plan_reads() -> None:
    from dp_textgrad.dp_es import plan as plan_module

    keyed = set(plan_module._SCHEDULE_FIELDS)
    assert keyed.isdisjoint(plan_module.PLAN_INDEPENDENT_FIELDS)
    assert keyed | plan_module.PLAN_INDEPENDENT_FIELDS == set(DPESConfig.model_fields)
