"""Released prompts read like something a person wrote for the task (issue 14).

The check (``mutation/readable.py``) flags fragments and words foreign to the task; the
mutator never adds either. Tested on the three built-in tasks from their public text only
(no data files needed), over several generations of rule edits.
"""

from __future__ import annotations

import numpy as np
import pytest

from dp_textgrad.dp_es.mutation import NO_LLM_WEIGHTS, MutationEngine
from dp_textgrad.dp_es.mutation.phrase_bank import INSTRUCTION_PHRASES
from dp_textgrad.dp_es.mutation.readable import foreign_words, instruction_problems, task_vocabulary
from dp_textgrad.dp_es.mutation.text_edits import Edit, PromptLayout
from dp_textgrad.dp_es.population import Candidate
from dp_textgrad.privacy.data import PublicText
from dp_textgrad.tasks import registry
from dp_textgrad.tasks.synthetic import make_support_task

ROUTING = "Use the label that the support desk would give the message."


def builtin(name: str) -> tuple[str, list[str], list, str]:
    """(description, labels, public examples, seed prompt) of a built-in task."""
    if name == "support":
        task = make_support_task(seed=0, n_private=20, n_test=5)
        return task.description, list(task.labels), list(task.public_examples), task.seed_prompt
    if name == "sst2":
        return registry.SST2_DESCRIPTION, ["negative", "positive"], list(registry.SST2_PUBLIC_EXAMPLES), \
            "Read the review."
    return registry.BANKING77_DESCRIPTION, list(registry.BANKING77_INTENTS), \
        list(registry.BANKING77_PUBLIC_EXAMPLES), "Read the question."


def mutator_for(name: str, seed: int = 0) -> tuple[MutationEngine, str]:
    description, labels, examples, seed_prompt = builtin(name)
    mutator = MutationEngine(None, PublicText(description, "user"), labels, examples, np.random.default_rng(seed),
                      weights=NO_LLM_WEIGHTS)
    return mutator, seed_prompt


def test_the_pasted_fragment_of_the_old_release_is_flagged() -> None:
    description, labels, examples, _ = builtin("support")
    vocabulary = task_vocabulary(description, labels, [e.text for e in examples])
    problems = instruction_problems(
        "Read the message. a positive message. Give the label without any explanation.", vocabulary)
    assert any("fragment" in p and "a positive message." in p for p in problems)
    assert any("foreign" in p and "positive" in p for p in problems)
    assert instruction_problems("Read the message. Give the label without any explanation.", vocabulary) == []


@pytest.mark.parametrize("sentence, why", [("read the message.", "capital"), ("Read the message", "full stop"),
                                           ("Label it.", "three words"), ("Answer with the label only.", None)])
def test_whole_sentences(sentence: str, why: str | None) -> None:
    problems = instruction_problems(sentence)
    assert (why is None and problems == []) or (len(problems) == 1 and why in problems[0])


def test_phrases_are_kept_only_for_tasks_whose_public_text_uses_their_words() -> None:
    support, _ = mutator_for("support")
    sst2, _ = mutator_for("sst2")
    assert ROUTING in map(str, support.context.phrases) and ROUTING not in map(str, sst2.context.phrases)
    assert len(sst2.context.phrases) < len(INSTRUCTION_PHRASES)
    assert "Choose the most specific label that fits." in map(str, sst2.context.phrases)  # generic phrases stay
    for mutator in (support, sst2):
        assert all(not foreign_words(str(p), mutator.context.vocabulary) for p in mutator.context.phrases)


def test_rule_edits_adding_a_foreign_phrase_or_a_fragment_are_refused() -> None:
    mutator, seed_prompt = mutator_for("sst2")
    seed = Candidate.new(seed_prompt, generation=0, operator="seed")
    assert mutator.accept(Edit(PromptLayout(f"{seed_prompt} {ROUTING}"), "insert_phrase", {}), seed) is None
    assert mutator.accept(Edit(PromptLayout(f"{seed_prompt} a positive one."), "insert_phrase", {}), seed) is None
    kept = mutator.accept(Edit(PromptLayout(f"{seed_prompt} Choose the most specific label that fits."),
                               "insert_phrase", {}), seed)
    assert kept is not None
    # an LLM rewrite may use new words, but not fragments
    assert mutator.accept(Edit(PromptLayout("Judge what the critic thinks of the film."), "llm_rewrite", {}), seed)
    assert mutator.accept(Edit(PromptLayout("Judge the film. and the critic."), "llm_rewrite", {}), seed) is None


def test_a_users_own_seed_prompt_is_not_judged() -> None:
    mutator, _ = mutator_for("support")
    seed = Candidate.new("classify this", generation=0, operator="seed")  # a fragment, the user's choice
    assert mutator.variants(seed, 4)


@pytest.mark.parametrize("name", ["support", "sst2", "banking77"])
def test_generations_of_rule_edits_on_builtin_tasks_read_well(name: str) -> None:
    mutator, seed_prompt = mutator_for(name, seed=7)
    parents = [Candidate.new(seed_prompt, generation=0, operator="seed")]
    seen = 0
    for generation in range(1, 7):
        children = mutator.children(parents, 8, generation)
        for child in children:
            context = mutator.context
            assert instruction_problems(context.layout(child).instruction, context.vocabulary) == [], child.text
        seen += len(children)
        parents = children[:3] or parents
    assert seen >= 30
