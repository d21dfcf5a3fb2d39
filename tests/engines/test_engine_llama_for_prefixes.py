"""One record under several candidate prompts on llama.cpp (``LlamaCppEngine.generate_for_prefixes``):
the prompts' sequences decoded together, so that an output depends on the public prefixes and
this one record only, never on another record."""

from __future__ import annotations

import numpy as np
import pytest

from dp_textgrad.engines.base import EngineError
from dp_textgrad.engines.llama_support import GenerationCache
from tests.engines.test_engine_llama_after_prefix import SUFFIXES, parting_is_a_near_tie

# Public text only: three short candidate prompts in the generation task's layout.
PREFIXES = [
    "Answer with the capital city only.\n\nInput: France\nOutput: Paris\n\nInput: Japan\nOutput: Tokyo\n\n",
    "Input: Japan\nOutput: Tokyo\n\nInput: France\nOutput: Paris\n\n",
    "Name the capital of each country.\n\nInput: Kenya\nOutput: Nairobi\n\n",
]
LONG_RECORD = "Input: " + "a very long and winding question about rivers, " * 14 + "\nOutput:"


def per_record(engine, records, **kwargs) -> list[list[str]]:
    return [engine.generate_for_prefixes(PREFIXES, r, **kwargs) for r in records]


@pytest.mark.slow
@pytest.mark.parametrize("max_tokens", [10, 100])  # 100: the prompts need two groups (n_ctx 512)
def test_a_records_outputs_do_not_depend_on_other_records_or_their_order(llama_engine, max_tokens) -> None:
    kwargs = {"max_tokens": max_tokens, "stop": ["\n"]}
    assert len(
        llama_engine._prefix_groups([tuple(llama_engine.tokenize(p, bos=True)) for p in PREFIXES], max_tokens)
    ) == (1 if max_tokens == 10 else 2)
    alone = []
    for record in SUFFIXES[:4]:
        llama_engine.score_choices_batch(
            "Sentiment.\n\n", ["Review: fine.\nSentiment:"], [" positive"]
        )  # empties the cache
        alone.append(llama_engine.generate_for_prefixes(PREFIXES, record, **kwargs))
    assert all(all(out) for out in alone)
    # The same record after others (x, r, y), in reverse order, after a long record: bit-identical.
    assert per_record(llama_engine, SUFFIXES[:4], **kwargs) == alone
    assert per_record(llama_engine, SUFFIXES[3::-1], **kwargs) == alone[::-1]
    mixed = per_record(llama_engine, [LONG_RECORD, SUFFIXES[2], "", SUFFIXES[0], SUFFIXES[0]], **kwargs)
    assert [mixed[1], mixed[3], mixed[4]] == [alone[2], alone[0], alone[0]]
    # Nor on the order or repetition of the prompts: the output for (prompt k, record) is the same.
    swapped = llama_engine.generate_for_prefixes([PREFIXES[2], PREFIXES[0], PREFIXES[1]], SUFFIXES[1], **kwargs)
    assert sorted(swapped) == sorted(alone[1])
    assert llama_engine.generate_for_prefixes([*PREFIXES, PREFIXES[0]], SUFFIXES[1], **kwargs) == [
        *alone[1],
        alone[1][0],
    ]
    # And label scores after a prefix are as they were (the scoring cache is shared).
    before = llama_engine.score_choices_batch(PREFIXES[0], SUFFIXES[:2], [" Rome", " Madrid"])
    per_record(llama_engine, SUFFIXES[:1], **kwargs)
    assert (llama_engine.score_choices_batch(PREFIXES[0], SUFFIXES[:2], [" Rome", " Madrid"]) == before).all()


@pytest.mark.slow
def test_outputs_equal_generate_after_prefix_up_to_near_ties(llama_engine) -> None:
    # Measured (1 thread, 3 prompts x 6 records, 12 tokens, stop "\n"): 16 of 18 equal; Italy
    # parts at its first token under two prompts (' Rome' against ' Milan'), a near tie. (Against
    # generate(prefix + record): 18 of 18.) The bound leaves room for other llama.cpp builds.
    together = per_record(llama_engine, SUFFIXES, max_tokens=12, stop=["\n"])
    pairs = [(p, s, out[k]) for s, out in zip(SUFFIXES, together, strict=True) for k, p in enumerate(PREFIXES)]
    equal = 0
    for prefix, suffix, text in pairs:
        one = llama_engine.generate_after_prefix(prefix, [suffix], max_tokens=12, stop=["\n"])[0]
        if one == text:
            equal += 1
        else:
            assert parting_is_a_near_tie(llama_engine, prefix + suffix, one, text), (one, text)
    assert equal >= 14, (equal, len(pairs))


@pytest.mark.slow
def test_a_record_too_long_for_its_group_goes_one_prompt_at_a_time(llama_engine) -> None:
    # 2 x (prompt + this record + 100 + 3) does not fit 512 cells: generate_after_prefix's path. Its
    # texts equal a direct call's up to near ties, as everywhere (measured on one build: the first
    # prompt parts at its first token, ' ' against ' a', 0.03 nats apart; the others are equal).
    kwargs = {"max_tokens": 100, "stop": ["\n"]}
    outputs = llama_engine.generate_for_prefixes(PREFIXES, LONG_RECORD, **kwargs)
    direct = [llama_engine.generate_after_prefix(p, [LONG_RECORD], **kwargs)[0] for p in PREFIXES]
    for prefix, one, other in zip(PREFIXES, direct, outputs, strict=True):
        if one != other:
            assert parting_is_a_near_tie(llama_engine, prefix + LONG_RECORD, one, other), (one, other)
    assert sum(a == b for a, b in zip(direct, outputs)) >= 2, (direct, outputs)


@pytest.mark.slow
def test_stops_budget_errors_sampling_and_the_cache(llama_engine) -> None:
    free = llama_engine.generate_for_prefixes(PREFIXES, SUFFIXES[0], max_tokens=20)
    stopped = llama_engine.generate_for_prefixes(PREFIXES, SUFFIXES[0], max_tokens=20, stop=["\n"])
    assert [text.split("\n")[0] for text in free] == stopped
    before = llama_engine.usage.completion_tokens
    one = llama_engine.generate_for_prefixes(PREFIXES, SUFFIXES[0], max_tokens=1)
    assert llama_engine.usage.completion_tokens - before == len(PREFIXES)
    assert all(f.startswith(o) for f, o in zip(free, one, strict=True))
    assert llama_engine.generate_for_prefixes([], SUFFIXES[0], max_tokens=4) == []
    assert len(llama_engine.generate_for_prefixes(PREFIXES, "", max_tokens=4)) == 3
    with pytest.raises(ValueError, match="max_tokens"):
        llama_engine.generate_for_prefixes(PREFIXES, SUFFIXES[0], max_tokens=0)
    huge = "word " * 600
    with pytest.raises(EngineError, match=r"no room to generate in the context \(512 tokens\)") as caught:
        llama_engine.generate_for_prefixes(PREFIXES, huge, max_tokens=4)
    assert str(llama_engine.count_tokens(huge)) not in str(caught.value)
    assert len(llama_engine.generate_for_prefixes(PREFIXES, SUFFIXES[0], max_tokens=4, temperature=0.7)) == 3
    cache = GenerationCache()
    llama_engine.cache = cache
    try:
        first = llama_engine.generate_for_prefixes(PREFIXES, SUFFIXES[1], max_tokens=6)
        assert llama_engine.generate_for_prefixes(PREFIXES, SUFFIXES[1], max_tokens=6) == first
        assert (cache.hits, cache.misses) == (3, 3)
    finally:
        llama_engine.cache = None


@pytest.mark.slow
def test_the_task_path_gives_a_record_the_same_outputs_alone_or_among_others(llama_engine) -> None:
    # GenerationTask.private_outcomes_many on the real engine: the outputs the metric sees for
    # record r are the same for the batch [r] and the batch [x, r, y].
    from dp_textgrad.privacy.data import PrivateDataset
    from dp_textgrad.tasks.generation import GenerationExample, GenerationTask
    from dp_textgrad.tasks.metrics import CallableMetric

    seen: list[str] = []

    def record_output(output: str, reference: object) -> float:
        seen.append(output)
        return float(output.strip() == reference)

    x, r, y = (GenerationExample(c, reference=a) for c, a in (("Italy", "Rome"), ("Spain", "Madrid"), ("Peru", "Lima")))
    task = GenerationTask(
        "capitals", "", PrivateDataset([x, r, y]), [], CallableMetric(record_output), max_new_tokens=8, stop=("\n",)
    )
    prompts = [p.rstrip() for p in PREFIXES]
    assert llama_engine.batches_prefixes
    task.private_outcomes_many(
        llama_engine, prompts, PrivateDataset([r]).poisson_subsample(1.0, np.random.default_rng(0))
    )
    alone = list(seen)  # prompt-major: one output per prompt
    seen.clear()
    task.private_outcomes_many(
        llama_engine, prompts, PrivateDataset([x, r, y]).poisson_subsample(1.0, np.random.default_rng(0))
    )
    assert len(alone) == 3 and len(seen) == 9 and all(alone)
    assert [seen[3 * k + 1] for k in range(3)] == alone
