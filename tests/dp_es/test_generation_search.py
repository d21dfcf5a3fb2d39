"""A generation task is searched as a generation task (issue 46): no classification phrase ever
reaches one of its prompts, its demonstrations are rendered with its own record template, and
the LLM operators show it worked examples of its own family."""

from __future__ import annotations

import re

import numpy as np
import pytest

import dp_textgrad
from dp_textgrad.dp_es.mutation import MutationEngine
from dp_textgrad.dp_es.mutation.phrase_bank import (
    CROSSOVER_EXAMPLES,
    FORMAT_INSTRUCTIONS,
    INSTRUCTION_PHRASES,
    REWRITE_EXAMPLES,
    VERBALISER_HINTS,
)
from dp_textgrad.dp_es.population import Candidate
from dp_textgrad.engines.scripted import ScriptedEngine
from dp_textgrad.privacy.data import PublicText
from dp_textgrad.tasks.record_format import split_record_format
from dp_textgrad.tasks.support_extract import make_support_extract_task

# Words that only a classification prompt has any use for.
CLASSIFICATION_WORDS = re.compile(r"\b(labels?|category|categories|classify|class)\b", re.IGNORECASE)
CLASSIFICATION_TEXT = [*INSTRUCTION_PHRASES, *FORMAT_INSTRUCTIONS, *(h.split("{")[0] for h in VERBALISER_HINTS)]


def _classification_phrases(text: str) -> list[str]:
    found = [phrase for phrase in CLASSIFICATION_TEXT if phrase.strip().lower() in text.lower()]
    return found + CLASSIFICATION_WORDS.findall(text)


def test_a_generation_run_never_proposes_a_classification_phrase(tmp_path) -> None:
    task = make_support_extract_task(seed=0, n_private=120, n_public=12, n_test=4)
    outcome = dp_textgrad.optimize(task, ScriptedEngine(), runs_root=tmp_path, epsilon=4.0, generations=4,
                                   population=6, parents=2, sampling_rate=0.3, dataset_size=120, evaluate=False,
                                   insecure_noise_seed=3, seed=5)
    candidates = outcome.optimizer.population.archive
    assert len(candidates) >= 12  # many rule edits were tried
    offending = {c.text: _classification_phrases(c.text) for c in candidates if _classification_phrases(c.text)}
    assert not offending, offending
    assert not _classification_phrases(outcome.result.prompt)
    # Every demonstration of every candidate is a public example written in the candidate's own
    # record format: the task's template, or the format the search moved it to.
    formats_seen = set()
    for candidate in candidates:
        body, record_format = split_record_format(candidate.text)
        formats_seen.add(record_format)
        rendered = {task.render_demo(example, record_format).strip() for example in task.public_examples}
        demos = [block.strip() for block in body.split("\n\n")[1:]]
        assert all(block in rendered for block in demos), [b for b in demos if b not in rendered][:3]
        if record_format is None:
            assert all(block.startswith("Message: ") and "\nAnswer: " in block for block in demos)
        else:
            assert record_format in task.record_formats
    assert None in formats_seen and len(formats_seen) >= 2  # the search tried other public formats


def test_the_llm_operators_show_a_generation_task_worked_examples_of_its_family() -> None:
    seen: list[str] = []

    def reply(prompt: str, system: str | None) -> str:
        seen.append(prompt)
        return "Write the account number exactly as it appears.</PROMPT>"

    task = make_support_extract_task(seed=0, n_private=10, n_public=6, n_test=2)
    engine = ScriptedEngine(responses=reply)
    mutation = MutationEngine(engine, PublicText(task.description, "user"), [], task.public_examples,
                              np.random.default_rng(0), render_demo=task.render_demo,
                              weights={"llm_rewrite": 1.0, "llm_crossover": 1.0})
    seed = Candidate.new("Read the message.", generation=0, operator="seed")
    other = Candidate.new("Find the account number.", generation=0, operator="seed")
    mutation.children([seed, other], 4, generation=1)
    assert seen, "no LLM operator ran"
    for prompt in seen:
        for task_text, *_ in (*REWRITE_EXAMPLES, *CROSSOVER_EXAMPLES):
            assert task_text not in prompt  # no classification worked example
        assert "Copy the order number out of a customer's email." in prompt


@pytest.mark.parametrize("family, banned", [("generate", "label"), ("classify", "Copy the answer exactly")])
def test_the_phrase_banks_are_chosen_by_family(family, banned) -> None:
    from dp_textgrad.dp_es.mutation.phrase_bank import phrase_banks

    phrases, formats = phrase_banks(family)
    assert phrases and formats and not any(banned.lower() in p.lower() for p in (*phrases, *formats))
    with pytest.raises(ValueError, match="family"):
        phrase_banks("rank")
