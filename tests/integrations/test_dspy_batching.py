"""Batched generation on the DSPy path (issue 49): one private record under every candidate at once,
the runs' LM calls meeting at a rendezvous and going to the engine together, one record per call;
a compile gives what the unbatched compile gives."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest

dspy = pytest.importorskip("dspy", reason="needs the [dspy] extra: pip install 'dp-textgrad[dspy]'")

from dp_textgrad.engines.base import EngineError  # noqa: E402
from dp_textgrad.engines.scripted import ScriptedEngine  # noqa: E402
from dp_textgrad.integrations.dspy import DPES, CompletionAdapter, EngineLM  # noqa: E402
from dp_textgrad.integrations.dspy.batching import (  # noqa: E402
    CandidateRendezvous,
    PrefixRequest,
    current_rendezvous,
    run_under_prompts,
)
from dp_textgrad.integrations.dspy.lm import batches_candidates  # noqa: E402
from tests.dp_es.test_generation_privacy import charges  # noqa: E402
from tests.integrations.test_dspy_optimizer import RUN, Classifier, bool_metric, example  # noqa: E402
from tests.integrations.test_dspy_programs import Pipeline  # noqa: E402

TIMEOUT = 30.0  # seconds: a rendezvous that never closes fails the test instead of hanging it


def mood(text: str) -> str:
    """The scripted model's answer: the mood of the record's LAST ``text:`` line."""
    lines = re.findall(r"^text: (.*)$", text, flags=re.M)
    record = lines[-1] if lines else ""
    if "crash" in record:
        raise EngineError("the server dropped the request")
    return "positive" if "good" in record else "negative"


class BatchingEngine(ScriptedEngine):
    """Decodes prompts together as LlamaCppEngine does (``batches_prefixes``) and records every
    ``generate_for_prefixes`` and ``generate_after_prefix`` call."""

    batches_prefixes = True
    instruction_following = False

    def __init__(self, fail_batches: bool = False) -> None:
        super().__init__(responses=lambda prompt, system: mood(prompt), model_string="batching")
        self.fail_batches = fail_batches
        self.batched: list[tuple[tuple[str, ...], str]] = []
        self.alone: list[tuple[str, str]] = []
        self.calls_lock = threading.Lock()

    def generate_for_prefixes(self, prefixes, suffix, **kwargs):  # type: ignore[no-untyped-def]
        with self.calls_lock:
            self.batched.append((tuple(prefixes), suffix))
        if self.fail_batches:
            raise EngineError("the batch did not fit")
        return [self.generate(prefix + suffix, **kwargs) for prefix in prefixes]

    def generate_after_prefix(self, prefix, suffixes, **kwargs):  # type: ignore[no-untyped-def]
        with self.calls_lock:
            self.alone.extend((prefix, suffix) for suffix in suffixes)
        return super().generate_after_prefix(prefix, suffixes, **kwargs)


def joined(threads_before: set[int]) -> None:
    """Fails if a thread the test started is still alive (a rendezvous left waiting)."""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        alive = [t for t in threading.enumerate() if t.ident not in threads_before and t.is_alive()]
        if not alive:
            return
        time.sleep(0.01)
    raise AssertionError(f"threads left waiting: {alive}")


# -- the rendezvous -------------------------------------------------------------------------------------
def test_each_round_goes_to_the_engine_together_one_record_per_call() -> None:
    engine = BatchingEngine()
    prompts = ["Say the mood.\n\n", "Label it.\n\n", "Say the mood.\n\n"]  # two runs share a prompt

    def run(prompt: str) -> list[str]:
        rendezvous = current_rendezvous()
        assert rendezvous is not None
        outputs = []
        for step in ("text: a good day\n", "text: a bad day\n"):  # two calls per run, in turn
            outputs.append(rendezvous.generate(PrefixRequest(engine, prompt, step, 4, None)))
        return outputs

    found = run_under_prompts(prompts, run)
    assert found == [["positive", "negative"]] * 3
    # One call per round, each with one suffix (one record's inputs) and the distinct prefixes once.
    assert engine.batched == [
        (("Say the mood.\n\n", "Label it.\n\n"), "text: a good day\n"),
        (("Say the mood.\n\n", "Label it.\n\n"), "text: a bad day\n"),
    ]
    assert engine.alone == []


def test_a_failing_run_a_silent_run_and_a_failing_batch_leave_every_run_its_own_outcome() -> None:
    before = {t.ident for t in threading.enumerate()}
    engine = BatchingEngine(fail_batches=True)

    def run(prompt: str) -> str:
        if prompt == "raise":
            raise ValueError("the program failed before its call")
        if prompt == "silent":
            return "no call"
        rendezvous = current_rendezvous()
        assert rendezvous is not None
        suffix = "text: crash\n" if prompt == "C.\n\n" else "text: a good day\n"
        return rendezvous.generate(PrefixRequest(engine, prompt, suffix, 4, None))

    found = run_under_prompts(["A.\n\n", "raise", "silent", "B.\n\n", "C.\n\n"], run)
    joined(before)
    assert found[0] == found[3] == "positive"  # the batch failed: each request went alone
    assert isinstance(found[1], ValueError) and found[2] == "no call"
    assert isinstance(found[4], EngineError)  # its own failure, as it had alone
    assert len(engine.batched) == 1 and {prefix for prefix, _ in engine.alone} == {"A.\n\n", "B.\n\n", "C.\n\n"}


def test_a_call_from_a_thread_the_program_starts_is_sent_alone() -> None:
    engine = BatchingEngine()
    rendezvous = CandidateRendezvous()
    with rendezvous.member():
        answers: list[str] = []
        helper = threading.Thread(
            target=lambda: answers.append(rendezvous.generate(PrefixRequest(engine, "P.\n\n", "text: good\n", 4, None)))
        )
        helper.start()
        helper.join(TIMEOUT)
        assert not helper.is_alive() and answers == ["positive"]
    assert engine.alone == [("P.\n\n", "text: good\n")] and engine.batched == []


# -- a compile --------------------------------------------------------------------------------------------
def private_records(n: int = 24) -> list[Any]:
    return [
        example(f"a {'good' if i % 2 else 'bad'} day number {i}", "positive" if i % 2 else "negative") for i in range(n)
    ]


PUBLIC = [example("a good film", "positive"), example("a bad film", "negative")]


def compile_with(tmp_path: Path, program: Any, batch: bool | None) -> tuple[Any, BatchingEngine, Any]:
    engine = BatchingEngine()
    lm = EngineLM(engine, max_tokens=4)
    dpes = DPES(
        bool_metric,
        lm=lm,
        engine=engine,
        adapter=CompletionAdapter(),
        public_trainset=PUBLIC,
        runs_root=tmp_path / str(batch),
        batch_candidates=batch,
        **RUN,
    )
    compiled = dpes.compile(program, trainset=private_records())
    return compiled, engine, dpes.outcome


@pytest.mark.parametrize("program", [Classifier, Pipeline], ids=["one_predictor", "two_predictors"])
def test_a_batched_compile_releases_what_the_unbatched_one_does(tmp_path, program) -> None:
    assert batches_candidates(EngineLM(BatchingEngine()))
    assert not batches_candidates(EngineLM(BatchingEngine(), reuse_prefix=False))
    assert not batches_candidates(EngineLM(ScriptedEngine()))
    batched, engine, outcome = compile_with(tmp_path, program(), None)  # automatic: on for this engine
    plain, plain_engine, plain_outcome = compile_with(tmp_path, program(), False)
    assert engine.batched and not plain_engine.batched
    # Every batched call holds ONE private record's inputs, under several candidates.
    texts = {ex.text for ex in private_records()}
    for prefixes, suffix in engine.batched:
        assert len(prefixes) > 1
        assert len([t for t in texts if re.search(rf"text: {re.escape(t)}(?!\d)", suffix)]) == 1, suffix
    assert batched.dp_guarantee.epsilon == plain.dp_guarantee.epsilon
    assert outcome.result.prompt == plain_outcome.result.prompt
    assert [c["event"] for c in charges(outcome.run_dir)] == [c["event"] for c in charges(plain_outcome.run_dir)]

    def estimates(run: Any) -> list[tuple[str, float, float]]:
        return [(h.best_candidate_id, h.best_estimate, h.mean_estimate) for h in run.optimizer.history]

    assert estimates(outcome) and estimates(outcome) == estimates(plain_outcome)  # the same noisy scores


# -- the local model ----------------------------------------------------------------------------------
CAPITALS = [("Kenya", "Nairobi"), ("Italy", "Rome"), ("Peru", "Lima"), ("Egypt", "Cairo")]
INSTRUCTIONS = ["Answer with the capital city only.", "Name the capital of the country.", "Capital city:"]


@pytest.mark.slow
def test_on_the_local_model_a_record_goes_once_under_every_candidate_with_the_texts_it_has_alone(
    llama_engine,
) -> None:
    """Through EngineLM and CompletionAdapter on llama.cpp: one ``generate_for_prefixes`` call per
    record (one record, three candidates), and the answers of the calls made one by one. (Measured
    on one build: 12 of 12 equal; llama.cpp's floats depend on which rows share a decode, so a near
    tie may part, as ``generate_for_prefixes``'s own test allows.)"""
    demos = [dspy.Example(country="France", capital="Paris"), dspy.Example(country="Japan", capital="Tokyo")]

    def program(instruction: str) -> Any:
        predictor = dspy.Predict(dspy.Signature("country -> capital", instruction))
        predictor.demos = list(demos)
        return predictor

    calls: list[tuple[int, str]] = []
    original = llama_engine.generate_for_prefixes

    def counted(prefixes, suffix, **kwargs):  # type: ignore[no-untyped-def]
        calls.append((len(prefixes), suffix))
        return original(prefixes, suffix, **kwargs)

    llama_engine.generate_for_prefixes = counted
    try:
        with dspy.context(lm=EngineLM(llama_engine, max_tokens=6), adapter=CompletionAdapter()):
            alone = [[program(i)(country=c).capital for i in INSTRUCTIONS] for c, _ in CAPITALS]
            together = [
                run_under_prompts(INSTRUCTIONS, lambda i, c=c: program(i)(country=c).capital) for c, _ in CAPITALS
            ]
    finally:
        del llama_engine.generate_for_prefixes
    assert [suffix.split("\n")[0] for _, suffix in calls] == [f"country: {c}" for c, _ in CAPITALS]
    assert all(n == len(INSTRUCTIONS) for n, _ in calls)
    pairs = [(a, b) for row_a, row_b in zip(alone, together, strict=True) for a, b in zip(row_a, row_b, strict=True)]
    assert sum(a == b for a, b in pairs) >= len(pairs) - 1, pairs
    assert sum(a == capital for row, (_, capital) in zip(alone, CAPITALS, strict=True) for a in row) >= 6, alone
