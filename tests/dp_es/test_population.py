"""Population: pooled estimates, dedupe, elitism by shrunk estimates, lineage, serialisation."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np
import pytest

from dp_textgrad.dp_es.population import (
    Candidate,
    ScoreEstimate,
    PopulationManager,
    make_candidate_id,
    normalise_text,
)
from dp_textgrad.privacy.data import Private, PrivateDataError


@dataclass
class FakeNoisyScores:
    candidate_ids: list[str]
    estimates: np.ndarray
    noise_std_estimate: float | np.ndarray


def variance_penalty(means: np.ndarray, variances: np.ndarray) -> np.ndarray:
    """Stand-in shrinkage: uncertain candidates are pulled down hard (makes ranking changes visible)."""
    return means - 10.0 * variances


def cand(text: str, generation: int = 1, parents: tuple[str, ...] = (), op: str = "test") -> Candidate:
    return Candidate.new(text, generation=generation, operator=op, parent_ids=parents)


def test_pooled_estimate_is_inverse_variance_weighted():
    c = cand("Classify the message.")
    assert c.mean_estimate is None and c.estimate_std is None
    c.evaluations += [ScoreEstimate(1, 0.5, 0.1), ScoreEstimate(2, 0.7, 0.2)]
    # weights 100 and 25
    assert c.mean_estimate == pytest.approx((100 * 0.5 + 25 * 0.7) / 125)
    assert c.estimate_std == pytest.approx(1 / math.sqrt(125))


def test_noiseless_evaluations_dominate():
    c = cand("Classify the message.")
    c.evaluations += [ScoreEstimate(1, 0.2, 0.5), ScoreEstimate(2, 0.9, 0.0), ScoreEstimate(3, 0.7, 0.0)]
    assert c.mean_estimate == pytest.approx(0.8)
    assert c.estimate_std == 0.0


def test_evaluation_rejects_non_finite_values():
    with pytest.raises(ValueError, match="estimate"):
        ScoreEstimate(0, float("nan"), 0.1)
    with pytest.raises(ValueError, match="noise_std"):
        ScoreEstimate(0, 0.5, -1.0)


def test_candidate_refuses_private_text():
    with pytest.raises(PrivateDataError):
        Candidate(id="x", text=Private("secret record"))


def test_ids_and_dedupe_key_ignore_case_and_whitespace():
    assert normalise_text("  Classify   the\nMessage. ") == "classify the message."
    assert make_candidate_id("Classify the message.", 2) == make_candidate_id("classify  THE message.", 2)
    assert make_candidate_id("Classify the message.", 2) != make_candidate_id("Classify the message.", 3)
    assert make_candidate_id("Classify the message.", 2) != make_candidate_id("Classify the email.", 2)


def test_initialise_puts_seed_first_dedupes_and_caps_size():
    pm = PopulationManager(size=3, elites=1, rng=np.random.default_rng(0), shrink=variance_penalty)
    seed = Candidate.new("Classify the message.", generation=0, operator="seed")
    variants = [
        Candidate.new("classify the   MESSAGE.", generation=0, operator="v"),  # duplicate of seed
        Candidate.new("Classify the message. Answer with one label.", generation=0, operator="v"),
        Candidate.new("Classify the message. Answer with one label.", generation=0, operator="v"),
        Candidate.new("Read it, then classify the message.", generation=0, operator="v"),
        Candidate.new("Sort the message into a topic.", generation=0, operator="v"),
    ]
    population = pm.initialise(seed, variants)
    assert len(population) == 3
    assert population[0] is seed
    keys = [c.key for c in population]
    assert len(set(keys)) == 3
    with pytest.raises(RuntimeError):
        pm.initialise(seed, variants)


def test_initialise_accepts_seed_text_and_rejects_empty():
    pm = PopulationManager(size=2, elites=1, shrink=variance_penalty)
    assert pm.initialise("Classify.")[0].operator == "seed"
    with pytest.raises(ValueError, match="seed"):
        PopulationManager(size=2, elites=1, shrink=variance_penalty).initialise("   ")


def test_constructor_validates_sizes():
    with pytest.raises(ValueError, match="size"):
        PopulationManager(size=0, elites=0)
    with pytest.raises(ValueError, match="elites"):
        PopulationManager(size=2, elites=3)


def _scored_population():
    pm = PopulationManager(size=4, elites=2, rng=np.random.default_rng(0), shrink=variance_penalty)
    seed = Candidate.new("Seed prompt.", generation=0, operator="seed")
    variants = [Candidate.new(t, generation=0, operator="v") for t in ("Prompt A.", "Prompt B.", "Prompt C.")]
    pm.initialise(seed, variants)
    ids = [c.id for c in pm.candidates]
    # Prompt A has the highest raw estimate but a huge noise std; the stand-in shrink pulls it to the bottom.
    pm.record(FakeNoisyScores(ids, np.array([0.50, 0.90, 0.60, 0.40]), np.array([0.05, 0.3, 0.05, 0.05])), 0)
    return pm, ids


def test_record_and_best_use_shrunk_estimates():
    pm, ids = _scored_population()
    shrunk = pm.shrunk_estimates()
    assert shrunk[ids[1]] == pytest.approx(0.90 - 10 * 0.09)
    best = pm.best(4)
    assert [c.id for c in best] == [ids[2], ids[0], ids[3], ids[1]]
    assert pm.get(ids[1]).evaluations == [ScoreEstimate(0, 0.9, 0.3)]


def test_record_validates_ids_and_lengths():
    pm, ids = _scored_population()
    with pytest.raises(KeyError, match="nope"):
        pm.record(FakeNoisyScores(["nope"], np.array([0.1]), 0.1), 1)
    with pytest.raises(ValueError, match="2 candidate ids but 1 estimates"):
        pm.record(FakeNoisyScores(ids[:2], np.array([0.1]), 0.1), 1)


def test_shrink_output_shape_is_checked():
    pm, _ = _scored_population()
    pm._shrink = lambda m, v: np.zeros(2)
    with pytest.raises(ValueError, match="shrink"):
        pm.best(1)


def test_unevaluated_candidates_rank_last():
    pm = PopulationManager(size=3, elites=1, shrink=variance_penalty)
    pm.initialise("Seed.", [cand("One.", 0), cand("Two.", 0)])
    third = pm.candidates[2]
    pm.record(FakeNoisyScores([third.id], np.array([0.3]), 0.01), 0)
    assert pm.best(1)[0] is third


def test_next_generation_elitism_dedupe_and_fill():
    pm, ids = _scored_population()
    elite_texts = [pm.get(ids[2]).text, pm.get(ids[0]).text]
    children = [
        cand("prompt b."),               # same text as an elite (case differs): dropped
        cand("Child one."),
        cand("child   ONE."),            # duplicate child: dropped
    ]
    new = pm.next_generation(children)
    assert len(new) == 4
    assert [c.text for c in new[:2]] == elite_texts
    assert new[2].text == "Child one."
    # one slot left: filled by the best remaining old candidate ('Prompt C.', ranked third)
    assert new[3].id == ids[3]
    assert pm.generation == 1
    archived = {c.id for c in pm.archive}
    assert all(c.id in archived for c in children)


def test_next_generation_with_too_many_children_is_reproducible():
    def run(seed):
        pm = PopulationManager(size=3, elites=1, rng=np.random.default_rng(seed), shrink=variance_penalty)
        pm.initialise("Seed.", [cand("A.", 0), cand("B.", 0)])
        pm.record(FakeNoisyScores([c.id for c in pm.candidates], np.array([0.2, 0.5, 0.1]), 0.01), 0)
        kids = [cand(f"Child {i}.") for i in range(10)]
        return [c.text for c in pm.next_generation(kids)]

    first = run(7)
    assert first == run(7)
    assert first[0] == "A."
    assert len(first) == 3 and all(t.startswith("Child") for t in first[1:])
    assert any(run(s) != first for s in range(8, 20))


def test_next_generation_takes_elites_from_given_parents():
    pm, ids = _scored_population()  # elites=2
    parents = [pm.get(ids[3]), pm.get(ids[1]), pm.get(ids[0])]  # e.g. an ordered DP top-k output
    new = pm.next_generation([cand("Fresh child.")], parents=parents)
    assert [c.id for c in new[:2]] == [ids[3], ids[1]]
    assert new[2].text == "Fresh child."
    assert new[3].id == ids[2]  # best remaining by shrunk estimate
    stranger = cand("Not in population.")
    with pytest.raises(KeyError, match="parents"):
        pm.next_generation([], parents=[stranger])


def test_lineage_follows_all_parents_breadth_first():
    pm = PopulationManager(size=3, elites=1, shrink=variance_penalty)
    seed = pm.initialise("Seed.", [cand("Variant.", 0)])[0]
    variant = pm.candidates[1]
    a = cand("Child A.", 1, (seed.id,))
    b = cand("Child B.", 1, (variant.id,))
    pm.next_generation([a, b])
    c = cand("Grandchild.", 2, (a.id, b.id), op="llm_crossover")
    pm.next_generation([c])
    chain = pm.lineage(c.id)
    assert [x.id for x in chain] == [c.id, a.id, b.id, seed.id, variant.id]
    with pytest.raises(KeyError):
        pm.lineage("missing")


def test_serialisation_round_trip_through_json():
    pm, ids = _scored_population()
    pm.next_generation([Candidate.new("Child X.", generation=1, operator="insert_phrase",
                                      parent_ids=(ids[0],), operator_meta={"phrase": "x", "position": np.int64(1)})])
    data = json.loads(json.dumps(pm.to_dict()))
    restored = PopulationManager.from_dict(data, shrink=variance_penalty)
    assert [c.to_dict() for c in restored.archive] == [c.to_dict() for c in pm.archive]
    assert [c.id for c in restored.candidates] == [c.id for c in pm.candidates]
    assert restored.generation == pm.generation
    assert restored.best(4)[0].id == pm.best(4)[0].id
    # the non-private rng continues where it stopped
    assert restored.rng.integers(1 << 30) == pm.rng.integers(1 << 30)
    assert restored.get(ids[1]).mean_estimate == pytest.approx(0.9)


def test_from_dict_rejects_corrupt_state():
    pm, _ = _scored_population()
    data = pm.to_dict()
    data["population"].append("g9-unknown")
    with pytest.raises(ValueError, match="population"):
        PopulationManager.from_dict(data, shrink=variance_penalty)


def test_operator_meta_must_be_jsonable():
    c = Candidate.new("Text.", generation=0, operator="x", operator_meta={"bad": object()})
    with pytest.raises(TypeError, match="operator_meta"):
        c.to_dict()
    c = Candidate.new("Text.", generation=0, operator="x", operator_meta={"bad": Private("secret")})
    with pytest.raises(PrivateDataError):
        c.to_dict()


def test_default_shrink_is_empirical_bayes():
    from dp_textgrad.dp_es import estimates
    pm = PopulationManager(size=4, elites=1)
    pm.initialise("Seed.", [cand(t, 0) for t in ("A.", "B.", "C.")])
    ids = [c.id for c in pm.candidates]
    means = np.array([0.2, 0.8, 0.5, 0.4])
    pm.record(FakeNoisyScores(ids, means, 0.1), 0)
    expected = estimates.shrink_estimates(means, np.full(4, 0.01))
    got = pm.shrunk_estimates()
    assert [got[i] for i in ids] == pytest.approx(list(expected))


def test_full_shrinkage_keeps_the_noisy_ranking():
    """When empirical Bayes pulls every estimate to the grand mean, the raw ranking decides."""

    def collapse(means: np.ndarray, variances: np.ndarray) -> np.ndarray:
        return np.full_like(means, float(np.mean(means)))

    pm = PopulationManager(size=4, elites=1, rng=np.random.default_rng(0), shrink=collapse)
    pm.initialise("seed prompt", [cand(f"variant {i}", generation=0) for i in range(3)])
    ids = [c.id for c in pm.candidates]
    estimates = np.array([0.40, 0.55, 0.45, 0.50])
    pm.record(FakeNoisyScores(ids, estimates, 0.05), generation=0)
    assert [c.id for c in pm.best(2)] == [ids[1], ids[3]]
