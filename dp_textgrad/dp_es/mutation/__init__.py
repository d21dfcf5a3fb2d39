"""Mutation of candidate prompts, from public text and DP releases only.

Modules, bottom up:

- ``phrase_bank``: public phrases and few-shot worked examples written for this library;
- ``barrier``: :func:`build_llm_prompt`, the only way text reaches a mutation or critique LLM;
- ``text_edits``: pure string work (LLM answer parsing, sentences, the prompt layout) and
  what an operator answers: an ``Edit`` (a proposed child) or a ``FailedLLMEdit``;
- ``context``: :class:`MutationContext`, the frozen public inputs, limits and seeded rng
  that are all an operator sees;
- ``llm_operators`` and ``operators``: the operators and their registry (``OPERATORS``);
- ``feedback``: :class:`FeedbackSanitiser` (hygiene only) and :func:`render_confusion`
  (DP confusion matrix to sentences, free post-processing);
- ``critique``: :class:`CritiquePipeline`, LLM advice per parent;
- ``mutation_engine``: :class:`MutationEngine`, which holds the context, the sanitiser and
  the critique pipeline, draws operators, accepts their edits and makes children;
- ``components``: :class:`ComponentMutationEngine`, one MutationEngine per part of a multi-part
  prompt (a DSPy program's predictors), one part edited per child.
"""

from dp_textgrad.dp_es.mutation.barrier import (
    Feedback,
    Scaffold,
    build_llm_prompt,
    candidate_text,
    check_public,
)
from dp_textgrad.dp_es.mutation.components import ComponentMutationEngine
from dp_textgrad.dp_es.mutation.context import MutationContext
from dp_textgrad.dp_es.mutation.critique import CritiquePipeline, extract_critique
from dp_textgrad.dp_es.mutation.feedback import (
    FeedbackSanitiser,
    render_confusion,
    render_failures,
    scrub_pii,
    truncate_text,
)
from dp_textgrad.dp_es.mutation.mutation_engine import MutationEngine
from dp_textgrad.dp_es.mutation.operators import (
    DEFAULT_WEIGHTS,
    LLM_OPERATORS,
    NO_LLM_WEIGHTS,
    OPERATORS,
    RULE_OPERATORS,
    Operator,
)
from dp_textgrad.dp_es.mutation.text_edits import (
    PROMPT_CLOSE,
    PROMPT_OPEN,
    Edit,
    FailedLLMEdit,
    PromptLayout,
    extract_prompt,
    is_degenerate,
    parse_layout,
    split_sentences,
)

__all__ = [
    "DEFAULT_WEIGHTS",
    "LLM_OPERATORS",
    "NO_LLM_WEIGHTS",
    "OPERATORS",
    "PROMPT_CLOSE",
    "ComponentMutationEngine",
    "PROMPT_OPEN",
    "RULE_OPERATORS",
    "CritiquePipeline",
    "Edit",
    "FailedLLMEdit",
    "Feedback",
    "FeedbackSanitiser",
    "MutationContext",
    "MutationEngine",
    "Operator",
    "PromptLayout",
    "Scaffold",
    "build_llm_prompt",
    "candidate_text",
    "check_public",
    "extract_critique",
    "extract_prompt",
    "is_degenerate",
    "parse_layout",
    "render_confusion",
    "render_failures",
    "scrub_pii",
    "split_sentences",
    "truncate_text",
]
