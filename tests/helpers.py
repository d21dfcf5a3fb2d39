"""Small test helpers for the mechanism tests: a rule-based fake engine, tiny tasks,
a zero-noise source for positive controls and
Clopper-Pearson bounds for empirical epsilon lower bounds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from dp_textgrad.privacy.noise import NoiseSource
from dp_textgrad.privacy.data import PrivateBatch, PrivateDataset
from dp_textgrad.engines.base import Engine, TokenLogprobs
from dp_textgrad.tasks.base import ClassificationTask, Example, RecordOutcomes

LABELS = ["billing", "shipping", "account"]

# Rule: (prefix, suffix, choices) -> unnormalised logits, one per choice.
LogitRule = Callable[[str, str, Sequence[str]], Sequence[float]]


def keyword_rule(prefix: str, suffix: str, choices: Sequence[str]) -> list[float]:
    """A choice scores 3 per mention of its word in the record and 1 per mention in the prompt."""
    record, prompt = suffix.lower(), prefix.lower()
    return [3.0 * record.count(c.strip().lower()) + 1.0 * prompt.count(c.strip().lower()) for c in choices]


class RuleEngine(Engine):
    """Deterministic fake engine: log-probs come from ``rule`` on the text. Counts calls."""

    model_string = "rule-engine"

    def __init__(self, rule: LogitRule = keyword_rule) -> None:
        super().__init__()
        self.rule = rule
        self.score_calls = 0
        self.records_scored = 0

    def _generate(self, prompt, *, system_prompt, temperature, max_tokens, seed, stop) -> str:
        return "rewritten prompt"

    def score_choices_batch(self, prefix: str, suffixes: Sequence[str], choices: Sequence[str]) -> np.ndarray:
        self.score_calls += 1
        self.records_scored += len(suffixes)
        logits = np.array([list(self.rule(prefix, s, choices)) for s in suffixes], dtype=float)
        logits = logits.reshape(len(suffixes), len(choices))
        if not len(suffixes):
            return logits
        shifted = logits - logits.max(axis=1, keepdims=True)
        return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))

    def token_logprobs(self, text: str, context: str = "") -> TokenLogprobs:
        tokens = text.split()
        return TokenLogprobs(tokens=tokens, logprobs=np.full(len(tokens), -1.0))


_TEMPLATES = [
    ("my {w} statement shows a charge twice", "billing"),
    ("refund for the {w} fee please", "billing"),
    ("the parcel never arrived, {w} is late", "shipping"),
    ("tracking number for {w} does not work", "shipping"),
    ("cannot log in to my {w} profile", "account"),
    ("reset the password of my {w}", "account"),
]


class ExactRuleEngine(RuleEngine):
    """A RuleEngine that declares what it is: scores that are a pure function of the text, with no
    state between calls (``deterministic_scores``), as a labelling phase requires of its engine."""

    deterministic_scores = True


def make_records(n: int, seed: int = 0) -> list[Example]:
    """Synthetic support tickets; about half mention their own label, half a random word."""
    rng = np.random.default_rng(seed)
    records = []
    for i in range(n):
        template, label = _TEMPLATES[int(rng.integers(len(_TEMPLATES)))]
        word = label if rng.random() < 0.5 else str(rng.choice(["order", "thing", "stuff"]))
        records.append(Example(f"ticket {i}: " + template.format(w=word), label))
    return records


def make_task(n_private: int = 30, *, seed: int = 0, score_kind: str = "accuracy",
              clip_bound: float = 1.0) -> ClassificationTask:
    return ClassificationTask(
        name="tiny-support",
        description="Route a support ticket to billing, shipping or account.",
        labels=list(LABELS),
        private_train=PrivateDataset(make_records(n_private, seed)),
        test=make_records(6, seed + 1000),
        public_examples=make_records(3, seed + 2000),
        score_kind=score_kind,  # type: ignore[arg-type]
        clip_bound=clip_bound,
        seed_prompt="Classify the ticket.",
    )


@dataclass
class TableTask(ClassificationTask):
    """A classification task whose raw per-record score is ``raw_score(prompt, record_text)``.

    Lets tests feed out-of-range and non-finite raw scores to the scorer.
    """

    raw_score: Callable[[str, str], float] = lambda prompt, text: 0.5

    def private_outcomes(self, engine, prompt, batch: PrivateBatch[Example], verbalizers=None) -> RecordOutcomes:
        base = super().private_outcomes(engine, prompt, batch, verbalizers)
        texts = [rec.unwrap().text for rec in batch]
        scores = np.array([self.raw_score(prompt, t) for t in texts], dtype=float)
        return RecordOutcomes(scores=scores, gold=base.gold, predicted=base.predicted)


def make_table_task(records: Sequence[Example], raw_score: Callable[[str, str], float],
                    clip_bound: float = 1.0) -> TableTask:
    return TableTask(
        name="table", description="table task", labels=list(LABELS),
        private_train=PrivateDataset(list(records)), test=[], clip_bound=clip_bound, raw_score=raw_score,
    )


@dataclass
class Cand:
    """A minimal candidate (the scorer reads only .id and .text)."""

    id: str
    text: str


def candidates(*texts: str) -> list[Cand]:
    return [Cand(f"c{i}", t) for i, t in enumerate(texts)]


class ZeroNoise(NoiseSource):
    """POSITIVE CONTROL ONLY: a noise source whose Gaussian and Gumbel noise is zero."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(insecure_seed=0)

    def normal(self, scale, size=None):
        return np.zeros(size) if size is not None else 0.0

    def gumbel(self, scale, size=None):
        return np.zeros(size) if size is not None else 0.0


# -- Clopper-Pearson empirical epsilon -------------------------------------------------


def clopper_pearson(successes: int, trials: int, level: float) -> tuple[float, float]:
    """One-sided Clopper-Pearson bounds: P(p < lower) <= level and P(p > upper) <= level."""
    lower = 0.0 if successes == 0 else float(stats.beta.ppf(level, successes, trials - successes + 1))
    upper = 1.0 if successes == trials else float(stats.beta.ppf(1 - level, successes + 1, trials - successes))
    return lower, upper


def epsilon_lower_bound(counts_a: np.ndarray, counts_b: np.ndarray, trials_a: int, trials_b: int,
                        delta: float = 0.0, alpha: float = 0.05) -> float:
    """Empirical epsilon lower bound from outcome counts on neighbouring datasets a and b.

    For each event (entry of the count arrays) and both directions, a (eps, delta)-DP
    mechanism has P_a(S) <= e^eps P_b(S) + delta, so eps >= ln((P_a(S) - delta) / P_b(S)).
    The probabilities are replaced by Clopper-Pearson bounds; Bonferroni over all
    events, directions and the two bounds of each test keeps the overall level alpha.
    Returns -inf if no event gives a positive numerator, +inf if the denominator bound is 0.
    """
    counts_a = np.atleast_1d(np.asarray(counts_a, dtype=int))
    counts_b = np.atleast_1d(np.asarray(counts_b, dtype=int))
    tests = 2 * counts_a.size
    level = alpha / (2 * tests)
    best = -math.inf
    for ca, cb in zip(counts_a, counts_b):
        lo_a, up_a = clopper_pearson(int(ca), trials_a, level)
        lo_b, up_b = clopper_pearson(int(cb), trials_b, level)
        for numerator, denominator in ((lo_a, up_b), (lo_b, up_a)):
            if numerator - delta <= 0:
                continue
            bound = math.inf if denominator <= 0 else math.log((numerator - delta) / denominator)
            best = max(best, bound)
    return best


def outcome_counts(selections: np.ndarray, num_outcomes: int) -> np.ndarray:
    return np.bincount(np.asarray(selections).reshape(-1), minlength=num_outcomes)


# The support task's cue words per verbaliser: a scripted "model" that reads the record and
# prefers " bill" unless the prompt lists the labels ("one of"), so prompts can be better or worse.
SUPPORT_CUES = {
    " bill": ("charge", "bill", "refund", "fee"),
    " tech": ("not working", "slow", "app", "error"),
    " cancel": ("cancel", "end my", "close my"),
    " fraud": ("unauthori", "scam", "stolen", "permission"),
    " update": ("address", "e-mail", "update", "details"),
}


def support_cue_rule(context: str, choices) -> list[float]:
    prompt, _, record = context.rpartition("Message:")
    bias = 0.0 if "one of" in prompt.lower() else 1.5
    return [sum(record.lower().count(c) for c in SUPPORT_CUES.get(ch, ())) + (bias if ch == " bill" else 0.0)
            for ch in choices]


# Children the scripted mutator proposes in the support-task runs of the Ray and Flower tests.
SUPPORT_RESPONSES = ["Label the message with one of: bill, tech, cancel, fraud, update.</PROMPT>",
                     "Read the customer message carefully and name its main request.</PROMPT>"]


def support_engine():
    """The tests-only scripted engine of those runs: scores by the support cues."""
    from dp_textgrad.engines.scripted import ScriptedEngine

    return ScriptedEngine(responses=list(SUPPORT_RESPONSES), choice_rule=support_cue_rule)


def broken_support_engine():
    """A support engine whose scoring fails with private text in its error (it must never be shown)."""
    engine = support_engine()

    def fail(*args, **kwargs):
        raise RuntimeError("record 17 says: my card was stolen")

    engine.score_choices_batch = fail
    return engine


def federated_silos(task, placement: str, count: int = 3, **options):
    """``count`` in-process silos dealt from ``task``'s records (Dirichlet 0.5), seeded noise."""
    import dataclasses

    from dp_textgrad.federated import Silo
    from dp_textgrad.federated.split import dirichlet_label_split

    records = [r.unwrap() for r in task.private_train]
    parts = dirichlet_label_split([r.label for r in records], count, 0.5, np.random.default_rng(0))
    return [Silo.build(f"s{i}", dataclasses.replace(task, private_train=PrivateDataset([records[j] for j in part])),
                       support_engine(), placement, count, max_record_tokens=256, insecure_seed=100 + i, **options)
            for i, part in enumerate(parts)]


def federated_run(task, silos, placement: str, dp: dict | None = None, **backend_options):
    """A 2-generation DP-ES run whose coordinator scores through ``silos`` in process:
    (optimizer, result, transport); the transport keeps every reply the coordinator received.
    ``dp``: more DPESConfig settings."""
    import dataclasses

    from dp_textgrad import DPEvolutionStrategy
    from dp_textgrad._textgrad import import_textgrad
    from dp_textgrad.federated import FederatedScoring, InProcessSilos, RemoteRecords

    tg = import_textgrad()
    transport = InProcessSilos(silos, keep_replies=True)
    backend = FederatedScoring(transport, [s.size for s in silos], placement, **backend_options)
    coordinator_task = dataclasses.replace(task, private_train=RemoteRecords(sum(s.size for s in silos)))
    prompt = tg.Variable(task.seed_prompt, role_description="instruction", requires_grad=True)
    optimizer = DPEvolutionStrategy([prompt], task=coordinator_task, engine=support_engine(),
                                    scoring=lambda *_: backend, epsilon=3.0, generations=2, population=4,
                                    sampling_rate=0.3, insecure_noise_seed=7, seed=1, **(dp or {}))
    return optimizer, optimizer.run(), transport
