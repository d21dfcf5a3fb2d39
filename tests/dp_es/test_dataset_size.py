"""The dataset size in a run: declared public, or a DP count charged first, never the real count.

Under add/remove neighbours the exact N is private. A run whose owner declares no N spends
``size_epsilon_share`` of epsilon on a noisy count before anything else; q, delta, every
denominator and every displayed size come from that count (or from the declared N), the
count is kept on resume and never charged again.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pytest

from dp_textgrad import DPEvolutionStrategy
from dp_textgrad._textgrad import import_textgrad
from dp_textgrad.dp_es.config import ConfigError, DPESConfig
from dp_textgrad.dp_es.plan import RunPlan
from dp_textgrad.engines.scripted import ScriptedEngine
from dp_textgrad.privacy.accounting import default_accountants
from dp_textgrad.privacy.accounting.events import PureDpEvent, group_events
from dp_textgrad.privacy.accounting.ledger import PrivacyLedger
from dp_textgrad.tasks.synthetic import make_support_task
from tests.twin import base_rows, run_twin

tg = import_textgrad()

N_RECORDS = 80


@pytest.fixture(scope="module")
def task():
    return make_support_task(seed=5, n_private=N_RECORDS, n_test=10)


def make_opt(task, tmp_path=None, **settings):
    prompt = tg.Variable(task.seed_prompt, role_description="instruction", requires_grad=True)
    engine = ScriptedEngine(responses=["Label the message with its intent.</PROMPT>"])
    defaults = dict(epsilon=2.0, generations=2, population=3, parents=2, feedback="none", use_critiques=False,
                    insecure_noise_seed=3, seed=1)
    defaults.update(settings)
    return DPEvolutionStrategy([prompt], task=task, engine=engine, checkpoint_dir=tmp_path, **defaults)


def test_an_undeclared_size_is_counted_first_and_everything_follows_the_count(task) -> None:
    opt = make_opt(task)
    config = opt.config
    noisy = config.counted_dataset_size
    assert config.dataset_size is None and isinstance(noisy, int) and noisy >= 1
    assert noisy != N_RECORDS  # this seed draws nonzero noise, so the checks below can tell them apart
    count = opt.ledger.entries[0]
    assert count.event == PureDpEvent(0.05 * 2.0)  # the discrete Laplace count: pure DP (issue 47)
    assert count.metadata["mechanism"] == "laplace_count" and count.epsilon == pytest.approx(0.1)
    # q, delta, the denominators and the displayed N come from the noisy count, not the records.
    assert config.sampling_rate == pytest.approx(min(1.0, 150 / noisy))
    assert config.delta == 1e-5
    assert opt.public_dataset_size == noisy
    assert opt.scorer.dataset_size == noisy
    assert opt.planned_private_evaluations == pytest.approx(config.sampling_rate * noisy * config.population)
    result = opt.run()
    assert len(opt.ledger.entries) == 1 + 2
    assert result.epsilon <= 2.0 + 1e-9


def test_the_ledger_is_the_plan_and_reports_the_two_stage_total(task) -> None:
    opt = make_opt(task, selection="permute_and_flip", final_selection="exponential", final_epsilon=0.2)
    opt.run()
    plan = opt.plan
    assert group_events(opt.ledger.events) == group_events([plan.event])  # count included, atom for atom
    delta = opt.config.delta
    search = {a.name: a.epsilon([plan.search_event], delta) for a in default_accountants()}
    expected = {name: 0.1 + value for name, value in search.items()}
    assert opt.ledger.epsilons() == pytest.approx(expected, rel=1e-6)
    assert plan.epsilons(delta) == pytest.approx(expected, rel=1e-6)
    assert opt.ledger.epsilon() <= 2.0 + 1e-9 and opt.ledger.epsilon() > 1.9


def test_a_declared_size_is_used_as_given_and_nothing_is_counted(task) -> None:
    opt = make_opt(task, dataset_size=1000)
    assert opt.config.counted_dataset_size is None and opt.config.size_epsilon == 0.0
    assert opt.config.delta == pytest.approx(1e-5)  # min(1e-5, 1/(10 N)) as before
    assert opt.config.sampling_rate == pytest.approx(0.15)
    assert opt.public_dataset_size == 1000 and opt.scorer.dataset_size == 1000
    opt.run()
    assert not any(e.metadata.get("mechanism") == "laplace_count" for e in opt.ledger.entries)
    assert opt.ledger.completed_stage_epsilon == 0.0


def test_the_count_is_kept_on_resume_never_recounted_or_recharged(task, tmp_path: Path) -> None:
    opt = make_opt(task, tmp_path, generations=3)
    noisy = opt.config.counted_dataset_size
    # The count is on disk before anything else happens (charged before it was read).
    on_disk = PrivacyLedger.from_jsonl(tmp_path / "ledger.jsonl")
    assert [e.metadata["mechanism"] for e in on_disk.entries] == ["laplace_count"]
    assert json.loads((tmp_path / "checkpoint.json").read_text())["config"]["counted_dataset_size"] == noisy
    opt.step()
    spent = opt.ledger.epsilon()
    prompt = tg.Variable("anything", role_description="instruction", requires_grad=True)
    # A different noise stream on resume must not matter: nothing is counted again.
    resumed = DPEvolutionStrategy.resume(tmp_path, [prompt], task=task,
                                         engine=ScriptedEngine(responses=["Label it.</PROMPT>"]))
    assert resumed.config.counted_dataset_size == noisy and resumed.public_dataset_size == noisy
    assert resumed.ledger.epsilon() == pytest.approx(spent, rel=1e-12)
    assert resumed.ledger.completed_stage_epsilon == pytest.approx(0.1)
    assert sum(e.metadata.get("mechanism") == "laplace_count" for e in resumed.ledger.entries) == 1
    resumed.run()
    assert sum(e.metadata.get("mechanism") == "laplace_count" for e in resumed.ledger.entries) == 1
    assert group_events(resumed.ledger.events) == group_events([resumed.plan.event])


def test_a_counted_size_cannot_be_set_by_hand(task) -> None:
    with pytest.raises(ConfigError, match="counted_dataset_size"):
        make_opt(task, counted_dataset_size=50)
    with pytest.raises(ValueError, match="counted_dataset_size"):
        DPESConfig(dataset_size=10, counted_dataset_size=12)


def test_delta_at_or_above_one_over_the_noisy_count_warns() -> None:
    config = DPESConfig(delta=0.05, counted_dataset_size=40)
    with pytest.warns(UserWarning, match="1/N"):
        config.resolved()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert DPESConfig(counted_dataset_size=40).resolved().delta == 1e-5
    with pytest.raises(ValueError, match="dataset_size"):
        DPESConfig().resolved()  # neither declared nor counted: no N to plan with


def test_budget_plans_the_count_and_says_so() -> None:
    from typer.testing import CliRunner

    from dp_textgrad import cli

    flags = ["--epsilon", "2", "--delta", "1e-5", "--generations", "3", "--population", "4", "--parents", "2",
             "--sampling-rate", "0.2", "--feedback", "none"]
    counted = CliRunner().invoke(cli.app, ["budget", *flags])
    assert counted.exit_code == 0, counted.output
    said = " ".join(counted.output.split())  # the console wraps long lines
    assert "a DP count of N" in said and "(basic composition)" in said
    plan = RunPlan.calibrated(DPESConfig(epsilon=2.0, delta=1e-5, generations=3, population=4, parents=2,
                                         sampling_rate=0.2, feedback="none"))
    z = float(re.search(r"noise multiplier z = ([0-9.]+)", counted.output).group(1))
    assert z == pytest.approx(plan.value, abs=1e-4)
    used = float(re.search(r"used: ([0-9.]+)", counted.output).group(1))
    assert used == pytest.approx(min(plan.epsilons(1e-5).values()), abs=1e-4)
    # Accounting a given noise: the count is the share of the budget a run at that noise has.
    given = CliRunner().invoke(cli.app, ["budget", *flags[2:], "--noise-multiplier", "1.5"])
    assert given.exit_code == 0, given.output
    search = min(RunPlan.with_value(DPESConfig(epsilon=2.0, delta=1e-5, dataset_size=1000, generations=3,
                                               population=4, parents=2, sampling_rate=0.2, feedback="none"),
                                    1.5).epsilons(1e-5).values())
    used = float(re.search(r"used: ([0-9.]+)", given.output).group(1))
    assert used == pytest.approx(search / 0.95, abs=1e-4)
    declared = CliRunner().invoke(cli.app, ["budget", *flags, "--dataset-size", "1000"])
    assert declared.exit_code == 0, declared.output
    assert "DP count" not in declared.output
    assert float(re.search(r"noise multiplier z = ([0-9.]+)", declared.output).group(1)) < z


# -- the real count never reaches a released file ------------------------------------------------
REAL_COUNT = 137  # a number that appears nowhere else in a run of this size


def test_the_real_record_count_is_in_no_released_file(tmp_path, monkeypatch) -> None:
    schedule = ("epsilon = 4\ngenerations = 2\npopulation = 3\nparents = 2\nfeedback = \"none\"\n"
                "use_critiques = false\ninsecure_noise_seed = 11\n")
    capture = run_twin(tmp_path, base_rows(REAL_COUNT), monkeypatch, schedule)
    assert capture.exit_code == 0, capture.stdout + capture.stderr
    released = json.loads(capture.released["config.json"])["dataset_size"]
    assert released != REAL_COUNT  # the seeded noise is nonzero here, or this test could not see a leak
    # The number as a number: not inside a longer number, a word or base64 (embedded images).
    pattern = re.compile(rb"(?<![\w.+/=])" + str(REAL_COUNT).encode() + rb"(?![\w.+/=])")
    leaks = {name: pattern.findall(data) for name, data in capture.released.items()
             if not name.startswith("plots/")}
    assert not any(leaks.values()), f"the real record count {REAL_COUNT} is released in {sorted(n for n, v in leaks.items() if v)}"
    # Power check: the released noisy count is found where N is shown.
    shown = re.compile(rb"(?<![\w.+/=])" + str(released).encode() + rb"(?![\w.+/=])")
    assert shown.search(capture.released["config.json"]) and shown.search(capture.released["<stdout>"])
