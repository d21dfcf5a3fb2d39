"""Labelling-utility benchmark: DP-ES with NO public labelled examples, its demos labelled by a DP teacher vote.

The question (issue 37): a user has private labelled records and public UNLABELLED inputs,
but no public labelled examples. How much of the gain of today's method (DP-ES with a few
public labelled examples) does a run keep when its demonstrations are public inputs whose
labels come from a noisy vote of teachers over disjoint groups of the private records
(``DPESConfig.labelling``, :mod:`dp_textgrad.dp_es.labelling`)?

Same engine, regimes, data and schedule as ``benchmarks/privacy_utility.py`` (imported, not
copied): the local Gemma 270M (llama.cpp, ``--threads``), ``generations`` 3 x ``population``
4 candidates scored on about ``records`` 48 private records, evaluation on the regime's whole
test split; regimes ``sst2_n2000`` and ``banking10``. Every arm below starts from the task
with ``public_examples = []``. Arms, per regime, epsilon and seed:

* ``seed``: the seed prompt (once per regime);
* ``dpes``: DP-ES alone (Gaussian scores), no public examples, no labelling;
* ``dplabels_dpes``: DP-ES with ``labelling=LabellingConfig(...)``: the first ``queries``
  inputs of the public pool get DP labels (``epsilon_share`` of epsilon, calibrated alone),
  the search gets the rest (composed by the run's accountant: one budget of epsilon);
* ``dplabels_kshot``: no search: the seed prompt followed by up to ``kshot_per_label``
  DP-labelled examples per label (balanced, drawn per seed and shuffled as
  ``privacy_utility``'s ``kshot`` baseline), taken from the labels RELEASED by the
  ``dplabels_dpes`` run of the same seed and epsilon. Its privacy cost is the labelling
  share alone (the labelling phase's epsilon, <= epsilon). When that run is missing, it labels
  on its own with ``dp_labels`` at the full epsilon (``plan_labelling``) instead;
* ``public_dpes``: the reference: today's method, DP-ES with the task's public LABELLED
  examples (``privacy_utility``'s ``dp_gaussian_eps{E}``). Its runs are taken from
  ``benchmarks/results/privacy_utility_powered.json`` when the schedule, the test split's
  size and N match (said per run and in the notes); ``--rerun-public`` runs them instead;
* ``dplabels_warmup_dpes`` (``--warmup``): ``dplabels_dpes`` with ``warmup_generations=2``;
  skipped, with a note, while the optimizer does not use that setting.

The public pool (an ASSUMPTION: the user's unlabelled inputs come from the task's own
distribution): SST-2 inputs of ``train.tsv`` that are not among the private records (texts of
at least ``--min-words`` words, labels dropped); BANKING77's ``dev.tsv`` on the 10 intents
(``banking10``'s private set is all of their ``train.tsv`` records, and ``dev.tsv`` shares no
text with train or test). The pool is shuffled by the run's seed and its first ``queries``
inputs are labelled, so the seeds average over pools too. The benchmark knows the pool's true
labels and reports the accuracy of the released DP labels against them (research evaluation
only: a user has no such labels).

Summary per regime and epsilon: each arm's mean test accuracy, paired bootstrap intervals
(``paired_bootstrap.py``: test records and seeds resampled) of its difference to ``seed`` and
to ``public_dpes``, the retained gain (arm - seed) / (public_dpes - seed) with its interval,
the issue's targets (``dplabels_dpes`` keeps >= 0.9 of the gain at epsilon 1, >= 0.75 at 0.5),
the DP labels' accuracy and the count answered, and the wall seconds of labelling and search.

Runs are appended one JSON line each to ``<work-dir>/runs.jsonl``; an interrupted grid resumes::

    python benchmarks/labelling_utility.py --threads 2                    # the grid, resumable
    python benchmarks/labelling_utility.py --summarise-only               # rebuild the JSON
    python benchmarks/labelling_utility.py --plan smoke --work-dir w --output smoke.json
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import hashlib
import json
import sys
import time
import warnings
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))  # privacy_utility, paired_bootstrap beside this file

import privacy_utility as pu  # noqa: E402
import run_records  # noqa: E402 - after the path set-up
from voting_cost import labelled_pool  # noqa: E402 - the same public pools as the vote-cost benchmark

DEFAULT_OUTPUT = REPO_ROOT / "benchmarks" / "results" / "labelling_utility.json"
DEFAULT_WORK_DIR = REPO_ROOT / "runs" / "benchmarks" / "labelling_utility"
DEFAULT_REUSE = REPO_ROOT / "benchmarks" / "results" / "privacy_utility_powered.json"
REGIMES = ("sst2_n2000", "banking10")
ARMS = ("seed", "dplabels_dpes", "dplabels_kshot", "dpes", "public_dpes")
WARMUP_ARM = "dplabels_warmup_dpes"
PUBLIC_WARMUP_ARM = "public_warmup_dpes"  # public_dpes with the warm-up: does it help when labels are public?
EXTRA_ARMS = (WARMUP_ARM, PUBLIC_WARMUP_ARM)
WARMUP_GENERATIONS = 2
# The targets on dplabels_dpes's retained gain, by epsilon.
TARGETS = {1.0: 0.9, 0.5: 0.75}
# The schedule fields a reused public_dpes run must share with this grid.
SCHEDULE_FIELDS = ("generations", "population", "parents", "records", "n_test")


@dataclass(frozen=True)
class Labelling:
    """The labelling phase's settings (CLI flags); None: the library's defaults."""

    teachers: int | None = None  # None: N // 20, clamped to [10, 100]
    queries: int = 16
    epsilon_share: float = 0.5
    max_demos: int = 6
    threshold: float | None = None
    threshold_sigma: float | None = None
    min_words: int = 6  # the pool's shortest input, in words

    def config(self):
        from dp_textgrad.dp_es.config import LabellingConfig

        return LabellingConfig(
            teachers=self.teachers,
            queries=self.queries,
            epsilon_share=self.epsilon_share,
            max_demos=self.max_demos,
            threshold=self.threshold,
            threshold_sigma=self.threshold_sigma,
        )


@dataclass(frozen=True)
class Job:
    regime: str
    arm: str
    epsilon: float | None
    seed: int

    @property
    def method(self) -> str:
        return self.arm if self.epsilon is None else f"{self.arm}_eps{self.epsilon:g}"

    @property
    def key(self) -> str:
        return f"{self.regime}/{self.method}/{self.seed}"


@dataclass
class Regime:
    """A regime's task (its public examples kept for public_dpes) and its public unlabelled pool."""

    task: Any
    pool: list[tuple[str, str]]  # (text, true label): the labels for research evaluation only
    pool_source: str


def run_key(row: dict[str, Any]) -> str:
    return f"{row['regime']}/{row['method']}/{row['seed']}"


# ----------------------------------------------------------------------------------
# data


def build_regime(regime: str, schedule: pu.Schedule, data_dir: str | None, min_words: int) -> Regime:
    from dp_textgrad.tasks.loaders import resolve_data_dir
    from dp_textgrad.tasks.registry import build_sst2

    if regime == "smoke":  # tiny: 40 private records
        task = build_sst2(data_dir, n_private=40, n_test=schedule.n_test, seed=0)
    else:
        task = pu.build_regime(regime, schedule, data_dir)
    # All train.tsv records of banking10's intents are private: its pool is dev.tsv (disjoint from both).
    source = (
        "banking77/dev.tsv on the 10 intents (disjoint from train.tsv and test.tsv)"
        if regime == "banking10"
        else "sst2/train.tsv outside the private records"
    )
    # The benchmark knows the private records (a measurement): the pool leaves them out.
    private = {record.unwrap().text for record in task.private_train}
    kind = "banking10" if regime == "banking10" else "sst2"
    pool = labelled_pool(resolve_data_dir(data_dir), kind, private, min_words)
    return Regime(task=task, pool=pool, pool_source=f"{source}, at least {min_words} words, labels dropped")


def pool_for(regime: Regime, seed: int, size: int) -> list[tuple[str, str]]:
    """The first ``size`` inputs of the pool in the seed's shuffled order."""
    order = np.random.default_rng(10_000 + seed).permutation(len(regime.pool))
    return [regime.pool[int(i)] for i in order[:size]]


# ----------------------------------------------------------------------------------
# runs


def label_accuracy(labelling: dict[str, Any], pool: list[tuple[str, str]]) -> dict[str, Any]:
    """The released labels against the pool's true labels (research evaluation only)."""
    labels = list(labelling.get("labels") or [])
    gold = [label for _, label in pool[: len(labels)]]
    inputs = labelling.get("inputs")
    answered = [(p, g) for p, g in zip(labels, gold) if p is not None]
    correct = sum(p == g for p, g in answered)
    return {
        "queries": len(labels),
        "answered": len(answered),
        "label_correct": correct,
        "label_accuracy": correct / len(answered) if answered else None,  # over the answered inputs
        "inputs_match_pool": None if inputs is None else list(inputs) == [t for t, _ in pool[: len(labels)]],
    }


class VoteCache:
    """The teachers' engine calls, remembered per (prefix, inputs, label words) across runs.

    The local engine is deterministic (the same text gives the same log-probs), and a seed's runs
    share their teacher partition (:func:`seeded_partition_key`) and public pool, so the runs of
    one seed at several epsilons ask the teachers the same questions: the vote histograms are
    the same and only the noise on them differs. Remembering the answers changes no label and no
    accuracy; it saves the labelling's engine time after a seed's first epsilon (its
    ``labelling_seconds`` are then near 0: the first run's are the measured cost).
    """

    def __init__(self) -> None:
        self._answers: dict[tuple, np.ndarray] = {}

    def engine(self, engine):
        answers = self._answers

        class Remembering:
            def __getattr__(self, name):
                return getattr(engine, name)

            def score_choices_batch(self, prefix, suffixes, choices):
                key = (prefix, tuple(suffixes), tuple(choices))
                if key not in answers:
                    answers[key] = np.asarray(engine.score_choices_batch(prefix, suffixes, choices), dtype=float)
                return answers[key].copy()

        return Remembering()


VOTES = VoteCache()


def seeded_partition_key(seed: int) -> bytes:
    """The benchmark's teacher partition key of a seed (the library draws a fresh random key per
    run; a fixed key per seed lets the runs of one seed share their teachers' votes)."""
    return hashlib.sha256(f"labelling-utility-benchmark-partition-{seed}".encode()).digest()


@contextlib.contextmanager
def shared_teachers(seed: int):
    """Within: the run's teachers use the seed's partition key and the remembered votes."""
    from dp_textgrad.dp_es import labelling, labelling_phase

    original_key, original_votes = labelling_phase.partition_key, labelling.teacher_votes

    def votes(engine, *args, **kwargs):
        return original_votes(VOTES.engine(engine), *args, **kwargs)

    labelling_phase.partition_key = lambda noise: seeded_partition_key(seed)
    labelling.teacher_votes = votes
    try:
        yield
    finally:
        labelling_phase.partition_key, labelling.teacher_votes = original_key, original_votes


def run_dplabels_dpes(
    job: Job,
    regime: Regime,
    engine,
    schedule: pu.Schedule,
    cache: pu.AccuracyCache,
    labelling: Labelling,
    warmup: int = 0,
) -> dict[str, Any]:
    """DP-ES on the task without public examples, its demonstrations labelled by the teacher vote."""
    from dp_textgrad import DPEvolutionStrategy, textgrad

    tg = textgrad()
    pool = pool_for(regime, job.seed, labelling.queries)
    task = replace(regime.task, public_examples=[], public_inputs=[text for text, _ in pool])
    n = len(task.private_train)
    settings: dict[str, Any] = dict(
        generations=schedule.generations,
        population=schedule.population,
        parents=schedule.parents,
        sampling_rate=min(1.0, schedule.records / n),
        seed=job.seed,
        epsilon=job.epsilon,
        selection="gaussian",
        labelling=labelling.config(),
    )
    if warmup:
        settings["warmup_generations"] = warmup
    prompt = tg.Variable(task.seed_prompt, role_description="instruction prompt for the classifier", requires_grad=True)
    before = run_records.usage(engine)
    started = time.perf_counter()
    opt = DPEvolutionStrategy([prompt], task=task, engine=engine, **settings)  # calibrates labelling + search
    setup_seconds = time.perf_counter() - started
    labelled_at = time.perf_counter()
    with shared_teachers(job.seed):
        opt.label()  # the labelling phase alone (the first step would run it), timed apart from the search
    labelling_seconds = time.perf_counter() - labelled_at
    per_generation: list[dict[str, Any]] = []
    while opt.stopped_because is None:
        report = opt.step()
        if report is None:
            break
        per_generation.append(
            {
                "generation": report.generation,
                "best_noisy_estimate": report.best_estimate,
                "epsilon_spent": None if opt.ledger.unsafe else report.epsilon_spent,
            }
        )
    result = opt.finalise()
    accuracy = cache.get(job.regime, task, engine, result.prompt)
    wall = time.perf_counter() - started
    used = run_records.usage_delta(before, run_records.usage(engine))
    released = dict(result.labelling or {})
    record = pu.RunRecord(
        regime=job.regime,
        method=job.method,
        seed=job.seed,
        epsilon_target=job.epsilon,
        epsilon_spent=None if result.unsafe else float(result.epsilon),
        delta=float(opt.config.delta),
        dataset_size=n,
        test_accuracy=accuracy,
        n_test=len(task.test),
        released_prompt=result.prompt,
        engine_calls=int(used["calls"]),
        prompt_tokens=int(used["prompt_tokens"]),
        completion_tokens=int(used["completion_tokens"]),
        engine_seconds=float(used["seconds"]),
        wall_seconds=wall,
        setup_seconds=setup_seconds,
        noise_multiplier=opt.noise_multiplier,
        selection_epsilon=opt.selection_epsilon,
        per_generation=per_generation,
        test_correct=cache.outcomes(job.regime, task, engine, result.prompt),
        notes={
            "stopped_because": opt.stopped_because,
            "public_examples": 0,
            "pool": regime.pool_source,
            **({"warmup_generations": warmup} if warmup else {}),
        },
    )
    return {
        **asdict(record),
        "arm": job.arm,
        "epsilon": job.epsilon,
        # As the other arms' wall seconds: set-up and test evaluation count with the search.
        "labelling_seconds": labelling_seconds,
        "search_seconds": wall - labelling_seconds,
        "labelling": {**released, **label_accuracy(released, pool), "gold": [label for _, label in pool]},
    }


def run_dplabels_kshot(
    job: Job,
    regime: Regime,
    engine,
    schedule: pu.Schedule,
    cache: pu.AccuracyCache,
    labelling: Labelling,
    source: dict[str, Any] | None,
) -> dict[str, Any]:
    """The seed prompt and DP-labelled examples as demonstrations: no search.

    ``source``: the dplabels_dpes run of the same seed and epsilon (its released labels; the cost
    is its labelling phase's epsilon). None: label here, alone, at the full epsilon.
    """
    from dp_textgrad.tasks.base import Example

    pool = pool_for(regime, job.seed, labelling.queries)
    started = time.perf_counter()
    before = run_records.usage(engine)
    labelling_seconds = 0.0
    if source is not None and source.get("labelling"):
        evaluation = ("gold", "label_correct", "label_accuracy", "inputs_match_pool")  # added by this benchmark
        released = {k: v for k, v in source["labelling"].items() if k not in evaluation}
        epsilon_spent = released.get("epsilon")
        delta = source.get("delta")
        origin = f"released by {source['method']} (seed {source['seed']})"
    else:
        labelling_started = time.perf_counter()
        released, epsilon_spent, delta = label_alone(job, regime, engine, pool, labelling)
        labelling_seconds = time.perf_counter() - labelling_started
        origin = "labelled here alone, at the full epsilon"
    demos = [Example(e["text"], e["label"]) for e in released.get("examples", [])]
    task = replace(regime.task, public_examples=demos)
    prompt, per_label = pu.kshot_prompt(task, schedule.kshot_per_label, job.seed)
    accuracy = cache.get(job.regime, task, engine, prompt)
    used = run_records.usage_delta(before, run_records.usage(engine))
    record = pu.RunRecord(
        regime=job.regime,
        method=job.method,
        seed=job.seed,
        epsilon_target=job.epsilon,
        epsilon_spent=None if epsilon_spent is None else float(epsilon_spent),
        delta=delta,
        dataset_size=len(task.private_train),
        test_accuracy=accuracy,
        n_test=len(task.test),
        released_prompt=prompt,
        engine_calls=int(used["calls"]),
        prompt_tokens=int(used["prompt_tokens"]),
        completion_tokens=int(used["completion_tokens"]),
        engine_seconds=float(used["seconds"]),
        wall_seconds=time.perf_counter() - started,
        test_correct=cache.outcomes(job.regime, task, engine, prompt),
        notes={"labels": origin, "per_label": per_label, "demos": prompt.count("\n\n"), "pool": regime.pool_source},
    )
    return {
        **asdict(record),
        "arm": job.arm,
        "epsilon": job.epsilon,
        "labelling_seconds": labelling_seconds,
        "search_seconds": 0.0,
        "labelling": {**released, **label_accuracy(released, pool), "gold": [label for _, label in pool]},
    }


def label_alone(
    job: Job, regime: Regime, engine, pool: list[tuple[str, str]], labelling: Labelling
) -> tuple[dict[str, Any], float, float]:
    """The labelling phase on its own at the whole epsilon: (its release, epsilon spent, delta)."""
    import secrets

    from dp_textgrad.dp_es.config import default_teachers
    from dp_textgrad.dp_es.labelling import dp_labels
    from dp_textgrad.privacy.accounting.ledger import PrivacyLedger
    from dp_textgrad.privacy.noise import NoiseSource
    from dp_textgrad.privacy.voting import plan_labelling

    task = regime.task
    n = len(task.private_train)
    delta = min(1e-5, 1.0 / (10 * n))  # DP-ES's default at a known N, as the other arms
    teachers = labelling.teachers or default_teachers(n)
    plan = plan_labelling(
        job.epsilon,
        delta,
        queries=len(pool),
        teachers=teachers,
        num_labels=len(task.labels),
        threshold=labelling.threshold,
        threshold_sigma=labelling.threshold_sigma,
    )
    ledger = PrivacyLedger(job.epsilon * (1 + 1e-9), delta)
    labelled = dp_labels(
        task,
        engine,
        [text for text, _ in pool],
        plan,
        ledger,
        NoiseSource(),
        secrets.token_bytes(32),
        max_demos=labelling.max_demos,
    )
    epsilon = float(ledger.epsilon())
    released = {
        **labelled.metadata,
        "epsilon_share": 1.0,
        "epsilon": epsilon,
        "labels": list(labelled.labels),
        "inputs": [text for text, _ in pool],
        "examples": [{"text": e.text, "label": e.label} for e in labelled.examples],
    }
    return released, epsilon, delta


def run_job(
    job: Job,
    regime: Regime,
    engine,
    schedule: pu.Schedule,
    cache: pu.AccuracyCache,
    labelling: Labelling,
    done: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    if job.arm == "seed":
        return {
            **asdict(pu.run_seed(pu.Job(job.regime, "seed", job.seed), regime.task, engine, schedule, cache)),
            "arm": "seed",
            "epsilon": None,
        }
    if job.arm in ("dpes", "public_dpes"):
        # privacy_utility's Gaussian DP-ES run; dpes on the task stripped of its public examples.
        task = regime.task if job.arm == "public_dpes" else replace(regime.task, public_examples=[])
        record = pu.run_dp_es(
            pu.Job(job.regime, f"dp_gaussian_eps{job.epsilon:g}", job.seed), task, engine, schedule, cache
        )
        record.method = job.method
        record.notes["public_examples"] = len(task.public_examples)
        return {**asdict(record), "arm": job.arm, "epsilon": job.epsilon, "search_seconds": record.wall_seconds}
    if job.arm == "dplabels_dpes":
        return run_dplabels_dpes(job, regime, engine, schedule, cache, labelling)
    if job.arm == WARMUP_ARM:
        return run_dplabels_dpes(job, regime, engine, schedule, cache, labelling, warmup=WARMUP_GENERATIONS)
    if job.arm == PUBLIC_WARMUP_ARM:
        record = pu.run_dp_es(
            pu.Job(job.regime, f"dp_gaussian_eps{job.epsilon:g}_warmup", job.seed), regime.task, engine, schedule, cache
        )
        record.method = job.method
        record.notes["public_examples"] = len(regime.task.public_examples)
        record.notes["warmup_generations"] = WARMUP_GENERATIONS
        return {**asdict(record), "arm": job.arm, "epsilon": job.epsilon, "search_seconds": record.wall_seconds}
    if job.arm == "dplabels_kshot":
        source = done.get(Job(job.regime, "dplabels_dpes", job.epsilon, job.seed).key)
        return run_dplabels_kshot(job, regime, engine, schedule, cache, labelling, source)
    raise ValueError(f"arm: unknown {job.arm!r}")


# ----------------------------------------------------------------------------------
# the grid


def plan_jobs(regimes: list[str], arms: list[str], epsilons: list[float], seeds: list[int]) -> list[Job]:
    """Regime by regime, seed-major (a partial grid covers every arm); dplabels_kshot after the
    dplabels_dpes run whose labels it shows."""
    order = [a for a in (*ARMS, *EXTRA_ARMS) if a in arms]
    jobs: list[Job] = []
    for regime in regimes:
        if "seed" in order:
            jobs.append(Job(regime, "seed", None, 0))
        for seed in seeds:
            for epsilon in epsilons:
                jobs += [Job(regime, arm, epsilon, seed) for arm in order if arm != "seed"]
    return jobs


def reused_public_rows(
    path: Path, schedule: pu.Schedule, sizes: dict[str, tuple[int, int]], epsilons: list[float]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """public_dpes rows from privacy_utility's grid, when its schedule and each regime's test split
    size and N match this grid's (``sizes``: regime -> (n_test, N)); and a note saying which."""
    if not path.is_file():
        return [], {"reused": False, "why": f"no file {path.name}"}
    grid = json.loads(path.read_text(encoding="utf-8"))
    theirs, ours = grid.get("schedule", {}), asdict(schedule)
    mismatched = [f for f in SCHEDULE_FIELDS if theirs.get(f) != ours.get(f)]
    if mismatched:
        return [], {"reused": False, "why": f"schedule differs in {mismatched}"}
    wanted = {f"dp_gaussian_eps{e:g}": e for e in epsilons}
    rows = []
    for row in grid.get("runs", []):
        regime, epsilon = row.get("regime"), wanted.get(row.get("method"))
        if epsilon is None or regime not in sizes or (row.get("n_test"), row.get("dataset_size")) != sizes[regime]:
            continue
        rows.append(
            {
                **row,
                "method": f"public_dpes_eps{epsilon:g}",
                "arm": "public_dpes",
                "epsilon": epsilon,
                "search_seconds": row.get("wall_seconds"),
                "notes": {**row.get("notes", {}), "reused_from": path.name, "original_method": row["method"]},
            }
        )
    return rows, {
        "reused": bool(rows),
        "from": path.name,
        "code_version": grid.get("code_version"),
        "schedule_matches": list(SCHEDULE_FIELDS),
        "runs": len(rows),
    }


def merged_rows(work_rows: list[dict[str, Any]], reused: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The work file's runs, then the reused runs it lacks (a rerun replaces a reused run)."""
    keys = {run_key(r) for r in work_rows}
    return [*work_rows, *(r for r in reused if run_key(r) not in keys)]


# ----------------------------------------------------------------------------------
# summary


def _mean(values: list[Any]) -> float | None:
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else None


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    from paired_bootstrap import decode_outcomes, paired_bootstrap

    regimes: dict[str, Any] = {}
    for regime in sorted({r["regime"] for r in rows}):
        in_regime = [r for r in rows if r["regime"] == regime]
        seed_rows = [r for r in in_regime if r["arm"] == "seed"]
        seed_acc = seed_rows[0]["test_accuracy"] if seed_rows else None
        by_epsilon: dict[str, Any] = {}
        for epsilon in sorted({r["epsilon"] for r in in_regime if r["epsilon"] is not None}):
            cell = [r for r in in_regime if r["epsilon"] == epsilon]
            arms: dict[str, Any] = {}
            for arm in sorted({r["arm"] for r in cell}, key=lambda a: (*ARMS, *EXTRA_ARMS).index(a)):
                runs = sorted((r for r in cell if r["arm"] == arm), key=lambda r: r["seed"])
                accuracies = [r["test_accuracy"] for r in runs]
                labels = [r.get("labelling") or {} for r in runs]
                arms[arm] = {
                    "seeds": [r["seed"] for r in runs],
                    "accuracy_mean": float(np.mean(accuracies)),
                    "accuracy_ci95": run_records.t_interval(accuracies),
                    "accuracies": accuracies,
                    "epsilon_spent_mean": _mean([r["epsilon_spent"] for r in runs]),
                    "labelling_epsilon_mean": _mean([lab.get("epsilon") for lab in labels]),
                    "label_accuracy_mean": _mean([lab.get("label_accuracy") for lab in labels]),
                    "answered_mean": _mean([lab.get("answered") for lab in labels]),
                    "queries": _mean([lab.get("queries") for lab in labels]),
                    "wall_seconds_mean": float(np.mean([r["wall_seconds"] for r in runs])),
                    "labelling_seconds_mean": _mean([r.get("labelling_seconds") for r in runs]),
                    "search_seconds_mean": _mean([r.get("search_seconds") for r in runs]),
                    "reused_runs": sum(1 for r in runs if "reused_from" in r.get("notes", {})),
                }
            paired: dict[str, Any] = {}
            with_outcomes = [*cell, *seed_rows[:1]]
            if (
                all(r.get("test_correct") for r in with_outcomes)
                and len({len(r["test_correct"]) for r in with_outcomes}) == 1
            ):
                outcomes = {
                    arm: np.vstack([decode_outcomes(r["test_correct"]) for r in cell if r["arm"] == arm])
                    for arm in arms
                }
                if seed_rows:
                    outcomes["seed"] = decode_outcomes(seed_rows[0]["test_correct"])[None, :]
                paired = paired_bootstrap(outcomes, reference="seed", ceiling="public_dpes")
            targets = []
            target = TARGETS.get(float(epsilon))
            for arm in ("dplabels_dpes", WARMUP_ARM):
                gain = (paired.get(arm) or {}).get("retained_gain")
                if target is not None and arm in arms:
                    ci = (paired.get(arm) or {}).get("retained_gain_ci")
                    targets.append(
                        {
                            "arm": arm,
                            "target": target,
                            "retained_gain": gain,
                            "retained_gain_ci": ci,
                            "met": gain is not None and gain >= target,
                            "met_by_ci_lower_bound": ci is not None and ci[0] >= target,
                        }
                    )
            by_epsilon[f"{epsilon:g}"] = {"arms": arms, "paired": paired, "targets": targets}
        regimes[regime] = {"seed_accuracy": seed_acc, "epsilons": by_epsilon}
    return regimes


def public_row(row: dict[str, Any]) -> dict[str, Any]:
    """A run as the results file keeps it: prompts as a fingerprint, the released labels without the inputs."""
    kept = {k: v for k, v in row.items() if k != "released_prompt"}
    if "released_prompt" in row:
        kept["released_prompt_sha256"] = hashlib.sha256(row["released_prompt"].encode("utf-8")).hexdigest()[:16]
        kept["released_prompt_chars"] = len(row["released_prompt"])
    if row.get("labelling"):
        kept["labelling"] = {k: v for k, v in row["labelling"].items() if k not in ("examples", "inputs")}
    return kept


def seed_agreement(rows: list[dict[str, Any]], reuse: Path) -> dict[str, float]:
    """Per regime, the share of test records on which this grid's seed prompt and the reused grid's agree
    (1.0: the same test split, engine and scoring)."""
    if not reuse.is_file():
        return {}
    theirs = {
        r["regime"]: r["test_correct"]
        for r in json.loads(reuse.read_text(encoding="utf-8")).get("runs", [])
        if r.get("method") == "seed" and r.get("test_correct")
    }
    agreement = {}
    for r in rows:
        other = theirs.get(r["regime"])
        if r["arm"] == "seed" and other and len(other) == len(r["test_correct"]):
            agreement[r["regime"]] = sum(a == b for a, b in zip(other, r["test_correct"])) / len(other)
    return agreement


def write_summary(
    rows: list[dict[str, Any]],
    output: Path,
    schedule: pu.Schedule,
    labelling: Labelling,
    command: str,
    reuse_note: dict[str, Any],
    reuse: Path,
    warmup_note: str | None,
) -> dict[str, Any]:
    from dp_textgrad._io import atomic_write_json
    from dp_textgrad.runs import code_version, machine_summary

    notes = {
        "public_pool": "an assumption: the public unlabelled inputs come from the task's own distribution "
        "(SST-2: train.tsv outside the private records; banking10: BANKING77 dev.tsv on the 10 intents, "
        "since all their train.tsv records are private); shuffled by the run's seed, the first `queries` labelled",
        "public_dpes": reuse_note,
        "seed_prompt_agreement_with_reused_grid": seed_agreement(rows, reuse),
        "dplabels_kshot": "privacy cost = the labelling phase's epsilon of the dplabels_dpes run whose labels it "
        "shows (<= epsilon); without that run, its own labelling at the full epsilon",
        "label_accuracy": "released DP labels against the pool's true labels: research evaluation only",
        "timings": "labelling_seconds: the teachers' vote (opt.label()); search_seconds: the rest of the run "
        "(calibration, generations, final selection and the test evaluation, as privacy_utility's wall seconds)",
    }
    if warmup_note:
        notes["warmup"] = warmup_note
    result = {
        "benchmark": "labelling_utility",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": command,
        "code_version": code_version(),
        "machine": machine_summary(),
        "schedule": asdict(schedule),
        "labelling": asdict(labelling),
        "targets": {f"{e:g}": t for e, t in TARGETS.items()},
        "notes": notes,
        "keys": {
            "regimes.<regime>.epsilons.<eps>.arms.<arm>": "accuracy_mean, accuracy_ci95 (t over seeds), "
            "epsilon_spent_mean, labelling_epsilon_mean, label_accuracy_mean (over answered inputs), "
            "answered_mean, wall/labelling/search_seconds_mean, reused_runs",
            "regimes.<regime>.epsilons.<eps>.paired.<arm>": "paired bootstrap (2,000 replicates, 95%): "
            "accuracy_ci, vs_seed(_ci), vs_public_dpes(_ci), retained_gain(_ci) = (arm - seed) / "
            "(public_dpes - seed)",
            "regimes.<regime>.epsilons.<eps>.targets": "issue 37: dplabels_dpes retained gain >= 0.9 at "
            "epsilon 1, >= 0.75 at 0.5",
            "runs": "one row per run; prompts as a fingerprint, DP labels without their inputs",
        },
        "regimes": summarise(rows),
        "runs": [public_row(r) for r in rows],
    }
    output.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(output, result)
    return result


def _fmt(value: float | None, ci: Any = None, digits: int = 3) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" + ("" if not ci else f" [{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]")


def table(result: dict[str, Any]) -> str:
    lines = []
    for regime, values in result["regimes"].items():
        lines.append(f"{regime}: seed prompt {_fmt(values['seed_accuracy'])}")
        for epsilon, cell in values["epsilons"].items():
            lines.append(f"  epsilon {epsilon}")
            for arm, m in cell["arms"].items():
                p = cell["paired"].get(arm, {})
                lines.append(
                    f"    {arm:22s} acc {_fmt(m['accuracy_mean'], p.get('accuracy_ci'))}  "
                    f"retained {_fmt(p.get('retained_gain'), p.get('retained_gain_ci'), 2)}  "
                    f"labels {_fmt(m['label_accuracy_mean'], digits=2)} ({_fmt(m['answered_mean'], digits=1)} "
                    f"answered)  eps {_fmt(m['epsilon_spent_mean'])}  "
                    f"s labelling/search {_fmt(m['labelling_seconds_mean'], digits=0)}/"
                    f"{_fmt(m['search_seconds_mean'], digits=0)}  seeds {len(m['seeds'])}"
                )
            for t in cell["targets"]:
                verdict = "met" if t["met"] else "MISSED"
                lines.append(
                    f"    target {t['arm']} retained >= {t['target']}: "
                    f"{_fmt(t['retained_gain'], t['retained_gain_ci'], 2)} ({verdict})"
                )
    return "\n".join(lines)


# ----------------------------------------------------------------------------------


def _list(text: str, kind=str) -> list:
    return [kind(v.strip()) for v in text.split(",") if v.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--plan",
        choices=("full", "smoke"),
        default="full",
        help="smoke: 40 private and 20 test records, 1 generation of 2, 4 teachers, 4 queries",
    )
    parser.add_argument("--regimes", default=None, help=f"comma-separated (default {','.join(REGIMES)})")
    parser.add_argument("--arms", default=None, help=f"comma-separated (default {','.join(ARMS)})")
    parser.add_argument("--epsilons", default=None, help="comma-separated (default 1,4; 0.5 an option)")
    parser.add_argument("--seeds", default=None, help="comma-separated (default 0,1,2,3,4)")
    parser.add_argument("--threads", type=int, default=None, help="llama.cpp threads (default: the engine's rule)")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--work-dir", type=Path, default=DEFAULT_WORK_DIR)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument("--summarise-only", action="store_true")
    parser.add_argument("--max-minutes", type=float, default=None, help="start no new run after this long")
    parser.add_argument("--teachers", type=int, default=None, help="teachers (default N // 20, in [10, 100])")
    parser.add_argument("--queries", type=int, default=None, help="public inputs labelled (default 16)")
    parser.add_argument("--epsilon-share", type=float, default=0.5, help="labelling's share of epsilon")
    parser.add_argument("--max-demos", type=int, default=6, help="demonstrations per teacher")
    parser.add_argument("--threshold", type=float, default=None, help="confident GNMax threshold (votes)")
    parser.add_argument("--threshold-sigma", type=float, default=None, help="confident GNMax threshold noise")
    parser.add_argument("--min-words", type=int, default=6, help="shortest public pool input, in words")
    parser.add_argument("--kshot-per-label", type=int, default=2, help="dplabels_kshot demonstrations per label")
    parser.add_argument(
        "--rerun-public",
        action="store_true",
        help="run public_dpes instead of reusing privacy_utility_powered.json's runs",
    )
    parser.add_argument("--reuse-from", type=Path, default=DEFAULT_REUSE)
    parser.add_argument(
        "--warmup",
        action="store_true",
        help=f"add the arms {', '.join(EXTRA_ARMS)} (warmup_generations={WARMUP_GENERATIONS})",
    )
    args = parser.parse_args(argv)

    smoke = args.plan == "smoke"
    schedule = (
        pu.Schedule(generations=1, population=2, parents=1, records=6, n_test=20, kshot_per_label=args.kshot_per_label)
        if smoke
        else pu.Schedule(kshot_per_label=args.kshot_per_label)
    )
    labelling = Labelling(
        teachers=args.teachers if args.teachers is not None else (4 if smoke else None),
        queries=args.queries if args.queries is not None else (4 if smoke else 16),
        epsilon_share=args.epsilon_share,
        max_demos=args.max_demos,
        threshold=args.threshold,
        threshold_sigma=args.threshold_sigma,
        min_words=args.min_words,
    )
    labelling.config()  # the library checks the settings before any work
    regimes = _list(args.regimes) if args.regimes else (["smoke"] if smoke else list(REGIMES))
    arms = _list(args.arms) if args.arms else list(ARMS)
    warmup_note = None
    if args.warmup:
        arms += [arm for arm in EXTRA_ARMS if arm not in arms]
    unknown = [a for a in arms if a not in (*ARMS, *EXTRA_ARMS)]
    if unknown:
        parser.error(f"--arms: unknown {unknown}; choose from {list(ARMS)}")
    epsilons = _list(args.epsilons, float) if args.epsilons else ([4.0] if smoke else [1.0, 4.0])
    seeds = _list(args.seeds, int) if args.seeds else ([0] if smoke else [0, 1, 2, 3, 4])
    command = " ".join(["python benchmarks/labelling_utility.py", *(sys.argv[1:] if argv is None else argv)])
    work_file = args.work_dir / "runs.jsonl"

    tasks: dict[str, Regime] = {}
    if not args.summarise_only:
        tasks = {r: build_regime(r, schedule, args.data_dir, labelling.min_words) for r in regimes}
        sizes = {r: (len(t.task.test), len(t.task.private_train)) for r, t in tasks.items()}
    else:
        sizes = {r["regime"]: (r["n_test"], r["dataset_size"]) for r in run_records.read_runs(work_file) if r["arm"] == "seed"}
    reused, reuse_note = (
        ([], {"reused": False, "why": "--rerun-public"})
        if args.rerun_public
        else reused_public_rows(args.reuse_from, schedule, sizes, epsilons)
    )

    if not args.summarise_only:
        from dp_textgrad.engines.llama_cpp import LlamaCppEngine

        done = {run_key(r): r for r in run_records.read_runs(work_file)}
        reused_keys = {run_key(r) for r in reused}
        jobs = [j for j in plan_jobs(regimes, arms, epsilons, seeds) if j.key not in done and j.key not in reused_keys]
        print(
            f"{len(done)} runs in {work_file}, {len(reused_keys)} public_dpes runs reused; {len(jobs)} to do",
            flush=True,
        )
        engine = LlamaCppEngine(n_threads=args.threads)
        cache = pu.AccuracyCache()
        started = time.perf_counter()
        for number, job in enumerate(jobs, 1):
            if args.max_minutes is not None and time.perf_counter() - started > 60 * args.max_minutes:
                print(f"time limit reached; {len(jobs) - number + 1} runs left", flush=True)
                break
            t0 = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                row = run_job(job, tasks[job.regime], engine, schedule, cache, labelling, done)
            run_records.append_run(work_file, row)
            done[job.key] = row
            lab = row.get("labelling") or {}
            print(
                f"[{number}/{len(jobs)}] {job.key}: test accuracy {row['test_accuracy']:.3f}"
                + (f", epsilon {row['epsilon_spent']:.3f}" if row.get("epsilon_spent") else "")
                + (
                    f", labels {lab['label_correct']}/{lab['answered']} right"
                    if lab.get("answered") is not None
                    else ""
                )
                + f" ({time.perf_counter() - t0:.0f} s)",
                flush=True,
            )
        engine.close()
    rows = merged_rows(run_records.read_runs(work_file), reused)
    result = write_summary(rows, args.output, schedule, labelling, command, reuse_note, args.reuse_from, warmup_note)
    print(table(result))
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
