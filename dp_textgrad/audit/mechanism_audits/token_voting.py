"""L1 audit of the token vote of DP answers (generation tasks) as the library runs it.

Each run is one answer of one token through the real code: the charge, the keyed partition, the
teachers' prompts (:func:`~dp_textgrad.dp_es.labelling.teacher_prompt`), the public candidates and
the teachers' votes (:class:`~dp_textgrad.dp_es.dp_answers.TeacherAnswers`) and the noisy argmax
(:func:`~dp_textgrad.privacy.token_voting.answer_by_vote`). The runs of one arm are the queries of
one :func:`~dp_textgrad.dp_es.dp_answers.dp_answers` call (the same public input asked ``runs``
times), so the claim per run is the event of one query, read from what the call charged: a call
that skips its charge claims 0.

The engine is a stub: its public model proposes the tokens "a" and "b" whatever the context; a
teacher votes for the answer of the demonstration in its prompt whose record came last in D (the
records are named r0, r1, ... in D's order; the canary, appended, comes last), when that answer is
a candidate, and for "a" otherwise. The auditor knows the partition key, so it builds records that
land on chosen teachers. Rows:

- ``canary_answer="b"``: "a" leads "b" by ``lead`` votes on D; the canary's teacher votes "a" on D
  and "b" on D + canary (one vote moves: the L2 sensitivity sqrt(2), the worst case). Statistic:
  "b" released. Teacher t holds (b_t, v_t) in that order, v_t its vote; a partition by position
  (contiguous chunks of two) shifts every chunk by one record when the canary is added, and chunk
  t becomes (v_t, b_{t+1}): every teacher votes "b".
- ``canary_answer="c"``: the canary's answer is a token no public source proposes. Correct code
  never releases it (the statistic "c" released is 0 in both arms); code that lets a teacher's
  records into the candidate set releases it on D + canary only, an unbounded privacy loss.

``vote="span"`` runs the span vote instead (:class:`~dp_textgrad.dp_es.dp_answers.SpanTeacherAnswers`):
the public input is "public a b", whose one-token spans are the candidates, and a teacher writes
the answer it would have voted for as its whole answer ("c" is no span: it votes "no span").
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from dp_textgrad.audit.mechanism_audits.trials import MechanismAuditResult, RecordingLedger, Trials, claimed_epsilon
from dp_textgrad.audit.statistics.lower_bounds import eps_lower_bound_from_scores
from dp_textgrad.privacy import voting
from dp_textgrad.privacy.data import PrivateDataset
from dp_textgrad.privacy.noise import NoiseSource
from dp_textgrad.privacy.token_voting import AnsweringPlan, TokenGNMax

AUDIT_KEY = b"dp-textgrad-audit-token-partition"
PUBLIC_TOKENS = ("a", "b")
_DEMO = re.compile(r"Input: (\S+)\nOutput: (\S+)")


class _StubEngine:
    """A deterministic engine for the audit: public proposals "a", "b"; teachers vote as above."""

    context_tokens = None
    deterministic_scores = True

    def top_next_pieces(self, prefix: str, suffix: str, k: int) -> list[str]:
        return list(PUBLIC_TOKENS[:k])

    def text_pieces(self, text: str) -> list[str]:
        return re.findall(r"\s*\S+", text)

    def generate_after_prefix(
        self, prefix: str, suffixes: Sequence[str], *, max_tokens: int, stop: Sequence[str] | None = None
    ) -> list[str]:
        return [" " + _wanted(prefix, None) + "\n" for _ in suffixes]

    def score_choices_batch(self, prefix: str, suffixes: Sequence[str], choices: Sequence[str]) -> np.ndarray:
        wanted = _wanted(prefix.rsplit("Input: public", 1)[0], choices)
        if any(suffix for suffix in suffixes):  # after the first token: end the answer
            wanted = "\n"
        return np.array([[1.0 if choice == wanted else 0.0 for choice in choices] for _ in suffixes])


def _wanted(prompt: str, choices: Sequence[str] | None) -> str:
    """The answer of the demonstration in ``prompt`` whose record came last in D, when it is one of
    ``choices`` (None: any), else "a"."""
    shown = _DEMO.findall(prompt)
    last = max(shown, key=lambda demo: math.inf if demo[0] == "canary" else int(demo[0][1:]), default=None)
    return last[1] if last is not None and (choices is None or last[1] in choices) else "a"


def _record(name: str, answer: str) -> Any:
    from dp_textgrad.tasks.generation import GenerationExample

    return GenerationExample(text=name, reference=answer)


def _records(teachers: int, lead: int, canary_answer: str) -> tuple[list[Any], Any]:
    """Teacher t holds (b_t, v_t), named in layout order; v_t is "a" for the leading voters and the
    canary's teacher, "b" for the others."""
    canary = _record("canary", canary_answer)
    target = voting.teacher_of(canary, AUDIT_KEY, teachers)
    voters_a = (teachers + lead) // 2
    if (teachers + lead) % 2 or not 1 <= voters_a <= teachers:
        raise ValueError(f"lead: teachers + lead must be even and lead in [2 - teachers, teachers], got {lead}")
    others = [t for t in range(teachers) if t != target]
    votes_a = {target, *others[: voters_a - 1]}
    counter = 0
    records: list[Any] = []

    def next_for(teacher: int, answer: str) -> Any:
        nonlocal counter
        for _ in range(100 * teachers + 1000):
            record = _record(f"r{counter}", answer)
            counter += 1
            if voting.teacher_of(record, AUDIT_KEY, teachers) == teacher:
                return record
        raise RuntimeError("audit_token_voting: no record found for a teacher")  # pragma: no cover - 2^-100 odds

    for t in range(teachers):
        records.append(next_for(t, "b"))
        records.append(next_for(t, "a" if t in votes_a else "b"))
    return records, canary


def audit_token_voting(
    *,
    canary_answer: str = "b",
    vote: str = "token",
    teachers: int = 8,
    sigma: float = 3.0,
    lead: int = 6,
    runs: int = 20000,
    delta: float = 1e-3,
    alpha: float = 0.05,
    seed: int = 0,
) -> MechanismAuditResult:
    """Audit the real DP-answer path on D vs D + canary (``runs`` one-token answers per arm)."""
    from dp_textgrad.dp_es.dp_answers import dp_answers
    from dp_textgrad.tasks.generation import GenerationTask
    from dp_textgrad.tasks.metrics import metric_from_name

    trials = Trials.checked(runs, 1.0, 1.0, delta, alpha, False, seed)
    if vote not in ("token", "span"):
        raise ValueError(f"vote: 'token' or 'span', got {vote!r}")
    if canary_answer in PUBLIC_TOKENS[:1] or not canary_answer.strip() or " " in canary_answer:
        raise ValueError(f"canary_answer: a one-word answer other than 'a', got {canary_answer!r}")
    started = time.perf_counter()
    background, canary = _records(teachers, lead, canary_answer)
    mechanism = TokenGNMax(sigma, max_tokens=1)
    plan = AnsweringPlan(mechanism, trials.runs, teachers)

    def arm(records: list[Any], noise_seed: int, ledger: RecordingLedger) -> np.ndarray:
        task = GenerationTask(
            name="audit",
            description="audit",
            private_train=PrivateDataset(records),
            test=[],
            metric=metric_from_name("exact"),
            record_template="Input: {text}\nOutput:",
            stop=("\n",),
        )
        engine: Any = _StubEngine()  # the calls the path makes, nothing more
        released = dp_answers(
            task,
            engine,
            ["public" if vote == "token" else "public a b"] * trials.runs,
            plan,
            ledger,
            NoiseSource(insecure_seed=noise_seed),
            AUDIT_KEY,
            prompt="",
            max_demos=4,
            candidates=len(PUBLIC_TOKENS),
            copy_input=False,
            vote=vote,
            max_answer_tokens=1,
            label="audit",
        )
        return np.array([float(answer == canary_answer) for answer in released.labels])

    base = 10_000 * (seed + 1)
    ledger = RecordingLedger()
    nonmembers = arm(background, base, RecordingLedger())
    members = arm([*background, canary], base + 1, ledger)
    bound = eps_lower_bound_from_scores(members, nonmembers, delta, alpha, "bonferroni", thresholds=[0.5])
    charged = ledger.events
    claim = claimed_epsilon(mechanism.event(1), delta) if charged == [plan.event] else 0.0
    return trials.result(
        f"{vote}_voting_{canary_answer}",
        claim,
        bound,
        None,
        started=started,
        parameters={
            "canary_answer": canary_answer,
            "vote": vote,
            "teachers": teachers,
            "sigma": float(sigma),
            "lead": lead,
            "seed": seed,
        },
        note="the real charge, partition, teacher prompts, public candidates, votes and release; a stub engine; "
        "one token per answer; claim per answer from the charged event; canary appended at the end",
    )


__all__ = ["AUDIT_KEY", "audit_token_voting"]
