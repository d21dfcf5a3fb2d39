"""The public warm-up (dp_textgrad.dp_es.warmup, ``dp.warmup_generations``): a non-private search on
the public labelled examples before the DP phase. It reads no private record, charges nothing (the
ledger is the plan, atom for atom), seeds generation 0 with its best prompts, scores each prompt on
the public examples it does not show, and is reproducible from the public seed."""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from dataclasses import replace

import pytest

from dp_textgrad import DPEvolutionStrategy
from dp_textgrad._textgrad import import_textgrad
from dp_textgrad.dp_es.population import Candidate, PopulationManager
from dp_textgrad.dp_es.warmup import HeldOutScore, WarmupResult, held_out_score, run_warmup, skip_reason
from dp_textgrad.engines.scripted import ScriptedEngine
from dp_textgrad.privacy.accounting.events import group_events
from dp_textgrad.privacy.data import Private, PrivateDataError, PrivateDataset
from dp_textgrad.tasks.base import ClassificationTask, Example
from dp_textgrad.tasks.synthetic import make_support_task
from tests.helpers import SUPPORT_RESPONSES, support_cue_rule

tg = import_textgrad()

LISTED = "Label the message with one of: bill, tech, cancel, fraud, update."


@pytest.fixture(scope="module")
def task() -> ClassificationTask:
    return make_support_task(seed=5, n_private=200, n_public=30, n_test=20)


def make_opt(task, **settings) -> DPEvolutionStrategy:
    prompt = tg.Variable(task.seed_prompt, role_description="instruction", requires_grad=True)
    defaults = dict(epsilon=3.0, generations=2, population=4, parents=2, sampling_rate=0.3,
                    insecure_noise_seed=7, seed=1, dataset_size=200)
    defaults.update(settings)
    engine = ScriptedEngine(responses=list(SUPPORT_RESPONSES), choice_rule=support_cue_rule)
    return DPEvolutionStrategy([prompt], task=task, engine=engine, **defaults)


@contextmanager
def no_private_access(monkeypatch):
    """Fails on any read of a private record or of the private dataset (its records, its size, a
    subsample) while the block runs: every way to private data goes through these."""
    reads: list[str] = []

    def spy(name, original):
        def wrapped(self, *args, **kwargs):
            reads.append(name)
            return original(self, *args, **kwargs)
        return wrapped

    with monkeypatch.context() as patch:
        patch.setattr(Private, "unwrap", spy("unwrap", Private.unwrap))
        for name in ("__iter__", "__getitem__", "__len__", "poisson_subsample", "fingerprint"):
            patch.setattr(PrivateDataset, name, spy(name, getattr(PrivateDataset, name)))
        yield reads
    assert reads == [], f"private data read during the warm-up: {sorted(set(reads))}"


# -- the run ----------------------------------------------------------------------------------------


def test_the_warm_up_reads_no_private_record_and_charges_nothing(task, monkeypatch) -> None:
    opt = make_opt(task, warmup_generations=3)
    entries = len(opt.ledger.entries)
    with no_private_access(monkeypatch) as reads:
        opt.initialise_population()
        assert reads == []
    assert len(opt.ledger.entries) == entries  # nothing charged
    assert opt.parts.warmup is not None and opt.parts.warmup.skipped_because is None
    assert len(opt.parts.warmup.scores) > opt.config.population  # it searched past the structured start


def test_the_guard_sees_a_dp_generations_private_reads(task, monkeypatch) -> None:
    """Positive control: the same guard around a DP generation fails (it reads the records)."""
    opt = make_opt(task, warmup_generations=2)
    opt.initialise_population()
    with pytest.raises(AssertionError, match="private data read"):
        with no_private_access(monkeypatch):
            opt.step()


@pytest.mark.parametrize("settings", [{}, {"dataset_size": None}, {"selection": "exponential", "feedback": "none"}],
                         ids=["gaussian", "size-counted", "exponential"])
def test_the_ledger_equals_the_plan_with_a_warm_up(task, settings) -> None:
    warm = make_opt(task, warmup_generations=2, **settings)
    cold = make_opt(task, **settings)
    assert warm.plan.value == cold.plan.value  # plan-independent: the calibration is the same
    warm.run()
    cold.run()
    assert group_events(warm.ledger.events) == group_events([warm.plan.event])
    assert [e.label for e in warm.ledger.entries] == [e.label for e in cold.ledger.entries]
    assert group_events(warm.ledger.events) == group_events(cold.ledger.events)
    assert warm.ledger.epsilons() == pytest.approx(cold.ledger.epsilons())


def test_generation_0_is_the_seed_then_the_warm_ups_best(task) -> None:
    opt = make_opt(task, warmup_generations=3)
    opt.initialise_population()
    warmup, population = opt.parts.warmup, opt.population.candidates
    assert population[0].id == "g0-seed"
    order = [c for c in warmup.seeding_order() if c.id != "g0-seed"][: opt.config.population - 1]
    assert [c.id for c in population[1:]] == [c.id for c in order]
    assert all("warmup" in c.operator_meta for c in population)
    # Ranked by public score, best first, and better than the seed; later warm-up generations' children
    # (one listing the labels, which the scripted model rewards) are among them.
    scores = [warmup.scores[c.id].score for c in population[1:]]
    assert scores == sorted(scores, reverse=True) and scores[0] > warmup.scores["g0-seed"].score
    assert any(c.operator_meta["warmup"]["generation"] >= 1 for c in population[1:])
    assert any(c.text.startswith(LISTED) for c in population[1:])
    # Every warm-up prompt is archived (the lineage of a released prompt reaches its warm-up parents).
    assert {c.id for c in warmup.ranked + warmup.unranked} <= {c.id for c in opt.population.archive}


def test_the_warm_ups_engine_use_is_generation_0s_public_usage(task) -> None:
    warm, cold = make_opt(task, warmup_generations=3), make_opt(task)
    warm_report, cold_report = warm.step(), cold.step()
    assert warm.parts.warmup.usage.calls > 0
    assert warm_report.public_calls >= warm.parts.warmup.usage.calls > 0
    assert warm_report.public_calls > cold_report.public_calls
    assert warm.parts.warmup.as_dict()["public_usage"]["calls"] == warm.parts.warmup.usage.calls


def test_the_warm_up_is_reproducible_from_the_public_seed(task) -> None:
    def generation_0(**settings) -> list[str]:
        opt = make_opt(task, warmup_generations=3, **settings)
        opt.initialise_population()
        return [c.text for c in opt.population.candidates]

    assert generation_0() == generation_0()
    assert generation_0(insecure_noise_seed=99) == generation_0()  # DP noise plays no part in it
    assert generation_0(seed=2) != generation_0()


def test_too_few_public_examples_skip_the_warm_up_with_a_public_reason(task) -> None:
    one_each = {}
    for example in task.public_examples:
        one_each.setdefault(example.label, example)
    thin = replace(task, public_examples=list(one_each.values()))
    opt = make_opt(thin, warmup_generations=2)
    with pytest.warns(UserWarning, match="warm-up skipped: .*at least 2 public labelled examples of every label"):
        opt.initialise_population()
    assert opt.parts.warmup.skipped_because is not None and opt.parts.warmup.ranked == []
    cold = make_opt(thin)
    cold.initialise_population()
    # Skipped, it leaves the public generator alone: generation 0 is the structured start.
    assert [c.text for c in opt.population.candidates] == [c.text for c in cold.population.candidates]


def test_no_warm_up_by_default(task) -> None:
    opt = make_opt(task)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opt.initialise_population()
    assert opt.parts.warmup is None


def test_the_warm_up_searches_on_the_dp_labelled_examples(monkeypatch) -> None:
    """No public labels: the labelling phase's DP-labelled examples (DP outputs) are the warm-up's
    public examples; the labelling is the only extra charge, and the warm-up adds none."""
    from tests.dp_es.test_labelling_phase import build, labelled_task
    from tests.helpers import make_records

    task = labelled_task(120, [e.text for e in make_records(40, seed=77)])
    options = dict(labelling={"teachers": 6, "queries": 16}, population=4, parents=2)
    warm, cold = build(task, warmup_generations=2, **options), build(task, **options)
    labelled = warm.label()
    assert labelled is not None and labelled.answered > 0
    with no_private_access(monkeypatch):
        warm.initialise_population()
    warmup = warm.parts.warmup
    assert warmup.skipped_because is None and warmup.examples == labelled.answered
    assert [c.id for c in warm.population.candidates[1:]] == [
        c.id for c in warmup.seeding_order() if c.id != "g0-seed"][: warm.config.population - 1]
    warm.run()
    cold.run()
    assert [e.label for e in warm.ledger.entries] == [e.label for e in cold.ledger.entries]
    assert warm.ledger.entries[0].label == "labelling"
    assert group_events(warm.ledger.events) == group_events(cold.ledger.events)


def test_a_generation_tasks_warm_up_scores_its_metric_on_the_public_examples(monkeypatch) -> None:
    from tests.dp_es.test_generation_privacy import city_task
    from tests.twin import LengthTimedGenerator, generation_records

    task = city_task(public_examples=generation_records(8, 200))
    prompt = tg.Variable(task.seed_prompt, role_description="instruction", requires_grad=True)
    opt = DPEvolutionStrategy([prompt], task=task, engine=LengthTimedGenerator(), epsilon=3.0, generations=1,
                              population=4, parents=2, sampling_rate=0.4, insecure_noise_seed=7, seed=1,
                              dataset_size=30, warmup_generations=2)
    with no_private_access(monkeypatch):
        opt.initialise_population()
    warmup = opt.parts.warmup
    # One group (the demonstrations of a generation task); a prompt asking for the city scores 1.
    assert warmup.skipped_because is None and warmup.scores["g0-seed"].score == 0.0
    top = opt.population.candidates[1]
    assert warmup.scores[top.id].score == 1.0 and top.operator_meta["warmup"]["generation"] == 1


# -- held-out scoring ---------------------------------------------------------------------------------


def _toy_task(public: list[Example]) -> ClassificationTask:
    return ClassificationTask(
        name="toy", description="Reviews.", labels=["neg", "pos"],
        private_train=PrivateDataset([Example("private good film", "pos")]), test=[], public_examples=public,
    )


def _word_rule(context: str, choices) -> list[float]:
    record = context.rpartition("Text:")[2]
    return [2.0 if ("good" in record) == (choice.strip() == "pos") else 0.0 for choice in choices]


def test_a_prompt_is_scored_only_on_the_examples_it_does_not_show() -> None:
    public = [Example("good film", "pos"), Example("good plot", "pos"), Example("bad film", "neg"),
              Example("awful, not good", "neg")]
    task, engine = _toy_task(public), ScriptedEngine(choice_rule=_word_rule)
    bare = held_out_score(task, engine, "Classify.", public)
    assert bare.held_out == 4 and bare.score == pytest.approx((1.0 + 0.5) / 2)  # balanced over labels
    # Showing the example the rule gets wrong removes it from the prompt's own score.
    shows = held_out_score(task, engine, "Classify.\n\nText: awful, not good\nLabel: neg", public)
    assert shows.held_out == 3 and shows.score == pytest.approx(1.0)
    # A prompt showing every negative example cannot be scored on that label: not ranked.
    both = held_out_score(task, engine, "Text: bad film\nLabel: neg\n\nText: awful, not good\nLabel: neg", public)
    assert both.score is None


def test_the_minimum_is_two_public_examples_per_label() -> None:
    public = [Example("good film", "pos"), Example("good plot", "pos"), Example("bad film", "neg")]
    assert "'neg': 1" in skip_reason(_toy_task(public), public)
    assert skip_reason(_toy_task(public), public + [Example("bad plot", "neg")]) is None


def test_a_private_record_among_the_public_examples_is_refused(task) -> None:
    leaky = replace(task)
    leaky.public_examples = [*task.public_examples, Private(Example("secret", "bill"))]  # past the task's check
    opt = make_opt(task, warmup_generations=2)
    seed = Candidate(id="g0-seed", text="Read the message.")
    with pytest.raises(PrivateDataError, match="public examples only"):
        run_warmup(seed, task=leaky, engine=opt.engine, mutation=opt.mutation, generations=2, population=4,
                   parents=2)


def test_generation_0_takes_prompts_judged_worse_than_the_seed_last() -> None:
    def cand(name: str) -> Candidate:
        return Candidate.new(name, generation=0, operator="seed" if name == "seed" else "x")

    seed, good, bad, unjudged = cand("seed"), cand("good"), cand("bad"), cand("unjudged")
    result = WarmupResult(
        2, 8, seed.id, ranked=[good, seed, bad], unranked=[unjudged],
        scores={seed.id: HeldOutScore(0.5, 8), good.id: HeldOutScore(0.75, 6), bad.id: HeldOutScore(0.25, 7),
                unjudged.id: HeldOutScore(None, 5)},
    )
    assert [c.text for c in result.seeding_order()] == ["good", "seed", "unjudged", "bad"]
    assert result.as_dict()["best"][0] == {"candidate_id": good.id, "public_score": 0.75, "held_out": 6}


def test_seeded_candidates_come_first_in_order() -> None:
    manager = PopulationManager(4, 1)
    seed = Candidate.new("Seed prompt.", generation=0, operator="seed")
    ranked = [Candidate.new(f"Ranked prompt {i}.", generation=0, operator="x") for i in range(5)]
    filler = [Candidate.new("Filler prompt.", generation=0, operator="x")]
    population = manager.initialise(seed, filler, seeded=ranked)
    assert [c.text for c in population] == ["Seed prompt.", "Ranked prompt 0.", "Ranked prompt 1.", "Ranked prompt 2."]
    assert len(manager.archive) == 7  # the rest are archived


# -- the local model -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_warm_up_on_the_local_model(llama_engine, monkeypatch) -> None:
    task = make_support_task(seed=2, n_private=40, n_public=12, n_test=4)
    prompt = tg.Variable(task.seed_prompt, role_description="instruction", requires_grad=True)
    opt = DPEvolutionStrategy([prompt], task=task, engine=llama_engine, epsilon=4.0, generations=1, population=3,
                              parents=1, sampling_rate=0.2, dataset_size=40, seed=0, insecure_noise_seed=0,
                              llm_operators=False, warmup_generations=2)
    with no_private_access(monkeypatch):
        opt.initialise_population()
    warmup = opt.parts.warmup
    assert warmup.skipped_because is None and warmup.ranked
    assert all(0.0 <= warmup.scores[c.id].score <= 1.0 for c in warmup.ranked)
    assert opt.population.candidates[0].id == "g0-seed"
    order = [c.id for c in warmup.seeding_order() if c.id != "g0-seed"]
    assert [c.id for c in opt.population.candidates[1:]] == order[:2]
    assert opt.ledger.entries == []
    result = opt.run()  # then the DP phase, charged as planned
    assert group_events(opt.ledger.events) == group_events([opt.plan.event])
    assert result.prompt in {c.text for c in opt.population.candidates}
