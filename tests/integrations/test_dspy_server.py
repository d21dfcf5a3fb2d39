"""``DPES`` against the real llama.cpp OpenAI-compatible server on loopback (Gemma 3 270M, a base
model): DSPy talks to it through ``dspy.LM(..., model_type="text")`` (the completions endpoint;
the chat endpoint answers a base model with empty text) and :class:`CompletionAdapter`. A
``dspy.Predict`` classifier and a ``dspy.ChainOfThought`` extractor compile with the ledger equal
to the plan, and the compiled programs run; once more with one of our engines (``OpenAIEngine``
on the same server) running the program through :class:`EngineLM`. A two-predictor program with
retrieval over the public help-centre corpus compiles against the server and on the local model,
the ledger equal to the plan, no private query left in any retriever or embedder cache.

Tiny runs (a dozen records, one or two generations, population 2): the point is that the whole
road works on a real server, not what a 270M base model learns.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

dspy = pytest.importorskip("dspy", reason="needs the [dspy] extra: pip install -e '.[dspy]'")

from dp_textgrad.integrations.dspy import DPES, CompletionAdapter, DPGuarantee  # noqa: E402
from dp_textgrad.privacy.accounting.events import group_events  # noqa: E402
from tests.conftest_openai import LLAMA_MODEL_ALIAS, llama_server  # noqa: E402,F401
from tests.dp_es.test_generation_privacy import charges, planned_atoms  # noqa: E402

pytestmark = pytest.mark.slow

RUN = dict(
    epsilon=3.0,
    generations=1,
    population=2,
    parents=1,
    elites=0,
    sampling_rate=1.0,
    seed=1,
    insecure_noise_seed=5,
    auto=None,
)

POSITIVE = [
    "a wonderful, moving film",
    "I loved every minute",
    "a delightful story",
    "great acting and a fine plot",
    "warm, funny and bright",
    "the best film this year",
]
NEGATIVE = [
    "boring and dull",
    "I hated every minute",
    "a tedious mess",
    "bad acting and a weak plot",
    "cold, flat and grey",
    "the worst film this year",
]
PEOPLE = [
    ("Dr. Maria Lopez met the team on Monday.", "Maria Lopez"),
    ("John Smith wrote the report.", "John Smith"),
    ("The award went to Priya Natarajan.", "Priya Natarajan"),
    ("Ask Tom Becker about the budget.", "Tom Becker"),
    ("Lena Hoffmann signed the lease.", "Lena Hoffmann"),
    ("Our guide was Kwame Mensah.", "Kwame Mensah"),
    ("Yuki Tanaka won the race.", "Yuki Tanaka"),
    ("The letter came from Omar Haddad.", "Omar Haddad"),
    ("Sofia Rossi opened the shop.", "Sofia Rossi"),
    ("Call Ines Duarte tomorrow.", "Ines Duarte"),
]


def text_lm(server: Any, max_tokens: int = 8) -> Any:
    """DSPy's own LM in text (completions) mode against the server, DSPy's response cache off."""
    return dspy.LM(
        f"openai/{LLAMA_MODEL_ALIAS}",
        api_base=server.base_url,
        api_key="local",
        model_type="text",
        temperature=0.0,
        max_tokens=max_tokens,
        cache=False,
        num_retries=0,
    )


def sentiment(text: str, label: str) -> Any:
    return dspy.Example(text=text, sentiment=label).with_inputs("text")


def sentiment_metric(example: Any, prediction: Any, trace: Any = None) -> bool:
    return str(prediction.sentiment).strip().lower() == example.sentiment


def person_metric(example: Any, prediction: Any, trace: Any = None) -> float:
    return float(example.person.lower() in str(prediction.person).lower())


def check_ledger_is_the_plan(dpes: DPES) -> None:
    outcome = dpes.outcome
    assert outcome is not None
    assert group_events(outcome.optimizer.ledger.events) == group_events([outcome.optimizer.plan.event])
    search = [c for c in charges(outcome.run_dir) if c["label"].startswith(("generation ", "final "))]
    assert search and [c["event"] for c in search] == planned_atoms(outcome.run_dir)


def classifier_data() -> tuple[list[Any], list[Any]]:
    public = [sentiment("a fine, happy film", "positive"), sentiment("a dull, sad film", "negative")]
    private = [sentiment(t, "positive") for t in POSITIVE] + [sentiment(t, "negative") for t in NEGATIVE]
    return public, private


def test_a_predict_classifier_compiles_against_the_server(llama_server, tmp_path: Path) -> None:  # noqa: F811
    public, private = classifier_data()
    dpes = DPES(
        sentiment_metric,
        lm=text_lm(llama_server),
        adapter=CompletionAdapter(),
        public_trainset=public,
        dataset_size=len(private),
        runs_root=tmp_path,
        **RUN,
    )
    compiled = dpes.compile(dspy.Predict("text -> sentiment"), trainset=private)
    check_ledger_is_the_plan(dpes)
    assert dpes.outcome.result.prompt.startswith(compiled.signature.instructions)  # then its public demos
    assert DPGuarantee.of(compiled).epsilon <= 3.0 + 1e-9
    with dspy.context(lm=text_lm(llama_server), adapter=CompletionAdapter()):
        answer = compiled(text="a lovely, joyful film").sentiment
    assert isinstance(answer, str) and answer.strip()


def test_a_chain_of_thought_extractor_compiles_against_the_server(llama_server, tmp_path: Path) -> None:  # noqa: F811
    public = [
        dspy.Example(
            text="Prof. Ana Ruiz spoke at noon.", reasoning="The sentence names the speaker.", person="Ana Ruiz"
        ).with_inputs("text")
    ]
    private = [dspy.Example(text=text, person=person).with_inputs("text") for text, person in PEOPLE]
    dpes = DPES(
        person_metric,
        lm=text_lm(llama_server, max_tokens=24),
        adapter=CompletionAdapter(),
        public_trainset=public,
        dataset_size=len(private),
        runs_root=tmp_path,
        **RUN,
    )
    compiled = dpes.compile(dspy.ChainOfThought("text -> person"), trainset=private)
    check_ledger_is_the_plan(dpes)
    assert dpes.outcome.result.prompt.startswith(compiled.predict.signature.instructions)  # then its public demos
    lm = text_lm(llama_server, max_tokens=24)
    with dspy.context(lm=lm, adapter=CompletionAdapter()):
        try:
            prediction = compiled(text="Nadia Petrova fixed the roof.")
        except dspy.utils.exceptions.AdapterParseError:  # the 270M base model may write nothing here
            prediction = None
    # The compiled program ran its released instruction through the server (an empty answer is the
    # model's, parsed by DSPy: it says nothing about the compile).
    assert lm.history and compiled.predict.signature.instructions[:40] in str(lm.history[-1])
    if prediction is not None:
        assert isinstance(prediction.person, str) and isinstance(prediction.reasoning, str)


def test_dpes_runs_the_program_through_our_own_engine(llama_server, tmp_path: Path) -> None:  # noqa: F811
    from dp_textgrad.engines.openai_engine import OpenAIEngine

    public, private = classifier_data()
    with OpenAIEngine(
        LLAMA_MODEL_ALIAS,
        base_url=llama_server.base_url,
        mode="completions",
        max_concurrency=1,
        timeout=120,
        max_retries=1,
        default_max_tokens=8,
    ) as engine:
        dpes = DPES(
            sentiment_metric,
            engine=engine,
            instruction_following=False,
            adapter=CompletionAdapter(),
            public_trainset=public,
            dataset_size=len(private),
            runs_root=tmp_path,
            **RUN,
        )
        compiled = dpes.compile(dspy.Predict("text -> sentiment"), trainset=private)
        check_ledger_is_the_plan(dpes)
        assert engine.usage.calls >= len(private)  # the program's calls went through the engine
    assert dpes.outcome.result.prompt.startswith(compiled.signature.instructions)  # then its public demos


class TwoStepRAG(dspy.Module):
    """Retrieval over the shipped public help-centre corpus, then two predictors: a topic, then the
    sentiment from the text and the topic; every predictor optimized, the retriever declared public."""

    def __init__(self) -> None:
        super().__init__()
        from dp_textgrad.tasks.help_centre import hashed_word_embedder, help_centre_articles

        self.retrieve = dspy.retrievers.Embeddings(
            corpus=help_centre_articles(),
            embedder=dspy.Embedder(hashed_word_embedder()),
            k=1,
            brute_force_threshold=100_000,
        )
        self.topic = dspy.Predict("text -> topic")
        self.judge = dspy.Predict("text, topic -> sentiment")

    def forward(self, text: str) -> Any:
        self.retrieve(text)  # a private query: sealed, kept nowhere
        topic = self.topic(text=text).topic
        return self.judge(text=text, topic=topic)


def compile_two_step_rag(
    lm: Any, runs_root: Path, engine: Any = None, generations: int = 2, population: int = 3
) -> tuple[DPES, Any]:
    from dp_textgrad.integrations.dspy.retrieval import cached_private_queries
    from dp_textgrad.tasks.components import split_components

    public, private = classifier_data()
    student = TwoStepRAG()
    dpes = DPES(
        sentiment_metric,
        lm=lm,
        engine=engine,
        adapter=CompletionAdapter(),
        public_trainset=public,
        public_retrievers=["retrieve"],
        dataset_size=len(private),
        runs_root=runs_root,
        **{**RUN, "generations": generations, "population": population},
    )
    compiled = dpes.compile(student, trainset=private)
    check_ledger_is_the_plan(dpes)
    split_components(dpes.outcome.result.prompt, ["topic", "judge"])  # both predictors in the release
    assert compiled.dp_guarantee.optimized == "topic, judge"
    queries = [example.text for example in private]
    assert cached_private_queries(student, queries) == [] and cached_private_queries(compiled, queries) == []
    return dpes, compiled


def test_a_two_predictor_retrieval_program_compiles_against_the_server(llama_server, tmp_path: Path) -> None:  # noqa: F811
    # One generation of two candidates over HTTP (the local-model test below runs two of three):
    # what this adds is DSPy's own LM driving both predictors through the server.
    compile_two_step_rag(text_lm(llama_server), tmp_path, generations=1, population=2)


def test_a_two_predictor_retrieval_program_compiles_on_the_local_model(llama_engine, tmp_path: Path) -> None:
    from dp_textgrad.integrations.dspy import EngineLM

    dpes, compiled = compile_two_step_rag(EngineLM(llama_engine, max_tokens=6), tmp_path, engine=llama_engine)
    with dspy.context(lm=EngineLM(llama_engine, max_tokens=6), adapter=CompletionAdapter()):
        assert isinstance(compiled(text="a lovely, joyful film").sentiment, str)
