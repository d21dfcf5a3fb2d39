"""Scoring on Ray actors: equal to the single-process path, faults handled, nothing private leaves.

A local Ray instance (2 CPUs), started once for the module, with the tests-only scripted
engine; one slow test runs the real local model on two actors through the CLI.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="needs the [ray] extra: pip install 'dp-textgrad[ray]'")

from dp_textgrad import DPEvolutionStrategy  # noqa: E402
from dp_textgrad._textgrad import import_textgrad  # noqa: E402
from dp_textgrad.distributed import RayScoringPool, partition_bounds  # noqa: E402
from dp_textgrad.dp_es.scoring_backends import LocalScoring  # noqa: E402
from dp_textgrad.engines.scripted import ScriptedEngine  # noqa: E402
from dp_textgrad.privacy.data import PrivateScoringError  # noqa: E402
from dp_textgrad.tasks.synthetic import make_support_task  # noqa: E402
from tests import helpers  # noqa: E402

tg = import_textgrad()

RESPONSES = helpers.SUPPORT_RESPONSES
make_engine = helpers.support_engine


class DiesOnce:
    """An engine factory whose first actor incarnation dies on its first scoring call."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __call__(self) -> ScriptedEngine:
        engine = make_engine()
        if self.marker.exists():
            return engine
        marker = self.marker
        original = engine.score_choices_batch

        def score_then_die(*args, **kwargs):
            marker.write_text("died")
            os._exit(1)  # the actor process dies mid-generation

        engine.score_choices_batch = score_then_die  # type: ignore[method-assign]
        del original
        return engine


broken_engine = helpers.broken_support_engine


@pytest.fixture(scope="module")
def local_ray():
    # Actors cannot import this test module: ship its functions (engine factories, rules) by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.cloudpickle.register_pickle_by_value(helpers)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def task():
    return make_support_task(seed=3, n_private=300, n_test=60)


def make_opt(task, scoring=None, **settings) -> DPEvolutionStrategy:
    prompt = tg.Variable(task.seed_prompt, role_description="instruction", requires_grad=True)
    config = dict(epsilon=3.0, generations=3, population=4, parents=2, sampling_rate=0.3,
                  insecure_noise_seed=7, seed=1)
    config.update(settings)
    return DPEvolutionStrategy([prompt], task=task, engine=make_engine(), scoring=scoring, **config)


def test_partition_bounds_cover_every_record_once() -> None:
    bounds = partition_bounds(10, 3)
    assert bounds == [(0, 3), (3, 7), (7, 10)]
    with pytest.raises(ValueError, match="actors"):
        partition_bounds(2, 3)


@pytest.mark.parametrize("selection", ["gaussian", "exponential"])
def test_distributed_run_equals_single_process_run(local_ray, task, selection) -> None:
    """Insecure test seed: the same subsample, sums, noisy values, ledger and released prompt."""
    extra = {"feedback": "none"} if selection != "gaussian" else {}
    single = make_opt(task, selection=selection, **extra)
    single_reports = [single.step() for _ in range(single.generations)]
    with RayScoringPool(make_engine, actors=2) as pool:
        spread = make_opt(task, scoring=pool, selection=selection, **extra)
        spread_reports = [spread.step() for _ in range(spread.generations)]
    assert spread.variable.value == single.variable.value
    def released(reports):  # JSON text: nan (no score released by a selection) equals nan
        return [json.dumps(r.as_dict(), sort_keys=True) for r in reports]

    assert released(spread_reports) == released(single_reports)
    assert [e.event for e in spread.ledger.entries] == [e.event for e in single.ledger.entries]
    assert spread.privacy_spent() == single.privacy_spent()


def test_totals_add_up_over_actors_with_feedback(local_ray, task) -> None:
    """The confusion counts (feedback) and sums over all records (q = 1) equal the local ones."""
    prompts = [task.seed_prompt, RESPONSES[0].removesuffix("</PROMPT>")]
    local = LocalScoring(task, make_engine(), np.random.default_rng(0)).totals(prompts, 1.0, 1.0, True)
    with RayScoringPool(make_engine, actors=3) as pool:
        backend = pool(task, make_engine(), np.random.default_rng(0), True)
        spread = backend.totals(prompts, 1.0, 1.0, True)
    assert np.array_equal(local.sums, spread.sums) and np.array_equal(local.confusion, spread.confusion)
    assert spread.confusion.sum() == 2 * len(task.private_train)


def test_secure_actors_draw_their_own_fresh_subsamples(local_ray, task) -> None:
    """Secure mode: each actor samples with its own CSPRNG; totals vary and average q N."""
    with RayScoringPool(make_engine, actors=2) as pool:
        backend = pool(task, make_engine(), np.random.default_rng(0), True)
        sizes = [backend.totals([task.seed_prompt], 0.5, 1.0, True).confusion.sum() for _ in range(12)]
    assert len(set(sizes)) > 1  # fresh draws
    n = len(task.private_train)
    assert abs(np.mean(sizes) - 0.5 * n) < 4 * np.sqrt(n * 0.25 / 12)


def test_an_actor_that_dies_is_restarted_and_its_share_rescored(local_ray, task, tmp_path) -> None:
    marker = tmp_path / "died"
    with RayScoringPool(DiesOnce(marker), actors=2, max_restarts=2) as pool:
        backend = pool(task, make_engine(), np.random.default_rng(0), True)
        totals = backend.totals([task.seed_prompt], 1.0, 1.0, True)
    assert marker.exists()  # an actor did die
    assert totals.confusion.sum() == len(task.private_train)  # yet every record was scored once


def test_an_engine_failing_on_an_actors_records_is_data(local_ray, task) -> None:
    # Failures on private records are data on the actors too: each scores 0, the step goes on.
    with RayScoringPool(broken_engine, actors=2, max_restarts=0) as pool:
        backend = pool(task, make_engine(), np.random.default_rng(0), True)
        totals = backend.totals([task.seed_prompt], 1.0, 1.0, False)
    assert totals.sums.tolist() == [0.0] and totals.errors == len(task.private_train)
    assert "stolen" in str(totals.error_detail)  # operator-only text, kept for the errors log


def test_an_actor_that_dies_keeps_the_charge_and_quotes_nothing(local_ray, task, tmp_path) -> None:
    with RayScoringPool(DiesOnce(tmp_path / "died"), actors=2, max_restarts=0) as pool:
        opt = make_opt(task, scoring=pool)
        with pytest.raises(PrivateScoringError) as caught:
            opt.step()
    assert len(opt.ledger.entries) == 2  # the DP count of N, then this step: charged before the actors were asked
    assert caught.value.__cause__ is None and caught.value.__context__ is None


def test_pool_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="distributed.actors"):
        RayScoringPool(make_engine, actors=0)
    with pytest.raises(TypeError, match="engine_factory"):
        RayScoringPool("llama", actors=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="distributed.max_restarts"):
        RayScoringPool(functools.partial(make_engine), max_restarts=-1)

