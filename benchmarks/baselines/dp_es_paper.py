"""DP-ES as its paper describes it (EMNLP 2026), rebuilt from the description for side-by-side runs.

Written here from the paper's description, not from its code. Per generation, each of the K
candidates is scored on its own b private records drawn without replacement from the N, and
the mean of their clipped scores is released with Gaussian noise of standard deviation
sigma x C / b (sigma the noise multiplier on the mean's sensitivity C / b under replace-one
neighbours). Parents are the top M noisy means of the generation; the released prompt is the
candidate with the best noisy mean seen over the whole run. Its accountant (autodp, Renyi DP,
replace-one, subsampling without replacement) prices K x T such releases.

Everything else is ours, so that only the use of private data differs between DP-ES and
dp-textgrad in a side-by-side run: the engine, the task, the initial population (the seed
prompt and its public variants) and the mutation operators come from
:class:`dp_textgrad.dp_es.generation.GenerationStep` built for the same schedule and public
seed. :func:`run_random_parents` is the epsilon-0 control: the same operators and schedule,
parents drawn at random, no private record read.

The paper's accounting is reproduced with autodp (a benchmark-only extra: ``pip install
autodp``; its figure, 0.705168 for sigma 10, b 10, N 200 and 18 releases at delta 1e-5, is
checked in the tests) and priced beside it with dp-accounting under both relations.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class PaperSettings:
    """The DP-ES protocol of the paper: N 200, K 6, M 2, T 3, b 10, sigma 10 (epsilon 0.705 at 1e-5)."""

    batch: int = 10  # b: records per candidate, drawn without replacement
    noise_multiplier: float = 10.0  # sigma, on the mean's replace-one sensitivity C / b
    population: int = 6
    parents: int = 2
    generations: int = 3
    clip_bound: float = 1.0

    @property
    def releases(self) -> int:
        return self.population * self.generations

    @property
    def mean_noise_std(self) -> float:
        """The noise std on one released mean: sigma C / b (1.0 for the paper's protocol)."""
        return self.noise_multiplier * self.clip_bound / self.batch


# -- accounting ---------------------------------------------------------------------------------------
def paper_epsilon_autodp(settings: PaperSettings, dataset_size: int, delta: float) -> float:
    """The paper's own figure: autodp's RDP of K x T Gaussian releases, each on b records sampled
    without replacement from N, under replace-one neighbours (autodp's default conversion)."""
    try:
        from autodp.mechanism_zoo import GaussianMechanism
        from autodp.transformer_zoo import AmplificationBySampling, Composition
    except ImportError as exc:  # the benchmark-only extra
        raise RuntimeError("autodp: the DP-ES paper's accountant; pip install autodp (benchmarks only)") from exc
    mechanism = GaussianMechanism(sigma=settings.noise_multiplier)
    mechanism.neighboring = "replace_one"  # sampling without replacement is defined for replace-one
    sampled = AmplificationBySampling(PoissonSampling=False)(mechanism, settings.batch / dataset_size)
    return float(Composition()([sampled], [settings.releases]).get_approxDP(delta))


def paper_epsilon_dp_accounting(settings: PaperSettings, dataset_size: int, delta: float) -> float:
    """dp-accounting's RDP of the identical mechanism: ``SampledWithoutReplacementDpEvent`` of a
    Gaussian of multiplier sigma (on the replace-one sensitivity), K x T times, REPLACE_ONE."""
    import dp_accounting
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.SampledWithoutReplacementDpEvent(
            dataset_size, settings.batch, dp_accounting.GaussianDpEvent(settings.noise_multiplier)
        ),
        settings.releases,
    )
    accountant = rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    accountant.compose(event)
    return float(accountant.get_epsilon(delta))


def paper_epsilon_add_remove(settings: PaperSettings, dataset_size: int, delta: float) -> float:
    """The same releases under add/remove neighbours, as our ledger prices them: a Poisson subsample
    of rate b / N standing in for the fixed-size one, and a mean over the public b, whose
    add/remove sensitivity is C / b, so the Gaussian's multiplier stays sigma (our PLD and RDP,
    the smaller)."""
    import dp_accounting

    from dp_textgrad.privacy.accounting.bounds import smallest_bound

    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(
            settings.batch / dataset_size, dp_accounting.GaussianDpEvent(settings.noise_multiplier)
        ),
        settings.releases,
    )
    return float(smallest_bound([event], delta))


def calibrate_paper_noise(
    epsilon: float, delta: float, settings: PaperSettings, dataset_size: int, relation: str
) -> PaperSettings:
    """The paper's protocol with sigma calibrated (bisection) to ``epsilon`` under ``relation``:
    ``replace_one`` (autodp, the paper's accountant) or ``add_remove`` (our ledger's pricing)."""
    price: Callable[[PaperSettings, int, float], float] = {
        "replace_one": paper_epsilon_autodp,
        "add_remove": paper_epsilon_add_remove,
    }[relation]
    low, high = 0.05, 500.0
    for _ in range(60):
        middle = math.sqrt(low * high)
        if price(PaperSettings(**{**settings.__dict__, "noise_multiplier": middle}), dataset_size, delta) > epsilon:
            low = middle
        else:
            high = middle
    return PaperSettings(**{**settings.__dict__, "noise_multiplier": high})


# -- the search ---------------------------------------------------------------------------------------
@dataclass
class SearchOutcome:
    """A baseline run's released prompt and what it released along the way (public for the paper's
    method: its noisy means; none for the epsilon-0 control)."""

    prompt: str
    released_estimate: float | None
    per_generation: list[dict[str, Any]] = field(default_factory=list)
    private_evaluations: int = 0


def generation_parts(task: Any, engine: Any, settings: PaperSettings, seed: int, dataset_size: int):
    """Our GenerationStep for the same schedule and public seed: its mutation engine and initial population."""
    from dp_textgrad.dp_es.config import DPESConfig
    from dp_textgrad.dp_es.generation import GenerationStep
    from dp_textgrad.dp_es.plan import RunPlan
    from dp_textgrad.privacy.accounting.ledger import PrivacyLedger
    from dp_textgrad.privacy.noise import NoiseSource

    config = DPESConfig(
        epsilon=1.0,  # unused: the baseline charges nothing of ours; the plan only shapes the parts
        generations=settings.generations,
        population=settings.population,
        parents=settings.parents,
        dataset_size=dataset_size,
        sampling_rate=min(1.0, settings.batch / dataset_size),
        seed=seed,
        llm_operators=bool(getattr(engine, "instruction_following", False)),
        feedback="none",
    ).resolved()
    step = GenerationStep.build(
        RunPlan.with_value(config, 1.0),
        task,
        engine,
        ledger=PrivacyLedger(1.0, 1e-5),  # the parts' scorer is never asked: nothing is charged to it
        noise=NoiseSource(insecure_seed=seed),
        public_rng=np.random.default_rng(seed),
        dataset_size=dataset_size,
    )
    step.initialise(task.seed_prompt)
    return step


def run_paper_dpes(task: Any, engine: Any, settings: PaperSettings, seed: int) -> SearchOutcome:
    """One DP-ES run as the paper describes it (module docstring); benchmark code, reading the
    private records directly (it measures, it releases nothing)."""
    from dp_textgrad.privacy.data import PrivateBatch

    records = list(task.private_train)
    size = len(records)
    secret = np.random.default_rng(secrets.randbits(128))  # the subsamples and the noise (OS-seeded)
    step = generation_parts(task, engine, settings, seed, size)
    population = list(step.population.candidates)
    best_text, best_value = population[0].text, -math.inf
    rows: list[dict[str, Any]] = []
    evaluations = 0
    for t in range(settings.generations):
        noisy = []
        for candidate in population:
            picks = secret.choice(size, settings.batch, replace=False)
            batch = PrivateBatch([records[int(i)] for i in picks])
            scores = np.clip(
                np.asarray(task.private_outcomes(engine, candidate.text, batch).scores, float), 0, settings.clip_bound
            )
            evaluations += settings.batch
            noisy.append(float(scores.mean() + secret.normal(0.0, settings.mean_noise_std)))
        order = np.argsort(-np.asarray(noisy), kind="stable")
        if noisy[int(order[0])] > best_value:  # the best noisy score so far is what the paper releases
            best_value, best_text = noisy[int(order[0])], population[int(order[0])].text
        parents = [population[int(i)] for i in order[: settings.parents]]
        rows.append({"generation": t, "best_noisy_mean": float(noisy[int(order[0])])})
        if t + 1 < settings.generations:
            children = step.mutation.offspring(parents, settings.population - 1, t + 1, {})
            population = [parents[0], *children]  # one elite, as in our default schedule
    return SearchOutcome(best_text, best_value, rows, evaluations)


def run_random_parents(task: Any, engine: Any, settings: PaperSettings, seed: int) -> SearchOutcome:
    """The epsilon-0 control: the same initial population, operators and schedule, parents drawn at
    random (public generator), no private record read; the released prompt is a random candidate of
    the last generation. If a DP method does not beat this, its private scores chose nothing."""
    rng = np.random.default_rng([seed, 0xE0])
    step = generation_parts(task, engine, settings, seed, len(task.private_train))
    population = list(step.population.candidates)
    for t in range(settings.generations - 1):
        picks = rng.choice(len(population), settings.parents, replace=False)
        parents = [population[int(i)] for i in picks]
        children = step.mutation.offspring(parents, settings.population - 1, t + 1, {})
        population = [parents[0], *children]
    return SearchOutcome(population[int(rng.integers(len(population)))].text, None, [], 0)


__all__ = [
    "PaperSettings",
    "SearchOutcome",
    "calibrate_paper_noise",
    "generation_parts",
    "paper_epsilon_add_remove",
    "paper_epsilon_autodp",
    "paper_epsilon_dp_accounting",
    "run_paper_dpes",
    "run_random_parents",
]
