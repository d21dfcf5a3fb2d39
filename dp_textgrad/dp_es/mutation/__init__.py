"""Mutation of candidate prompts, from public text and DP releases only.

Modules, bottom up:

- ``phrase_bank``: public phrases and few-shot worked examples written for this library;
- ``barrier``: :func:`build_llm_prompt`, the only way text reaches a mutation or critique LLM;
- ``text_edits``: pure string work (LLM answer parsing, sentences, the prompt layout);
- ``llm_operators`` and ``operators``: the operators and their registry (``OPERATORS``);
- ``mutator``: :class:`MutationEngine`, which draws operators and makes children;
- ``feedback``: :class:`FeedbackSanitiser` (hygiene only) and :func:`render_confusion`
  (DP confusion matrix to sentences, free post-processing);
- ``critique``: :class:`CritiquePipeline`, LLM advice per parent.
"""

from dp_textgrad.dp_es.mutation.barrier import (
    Feedback,
    Scaffold,
    build_llm_prompt,
    candidate_text,
    check_public,
)
from dp_textgrad.dp_es.mutation.critique import CritiquePipeline, extract_critique
from dp_textgrad.dp_es.mutation.feedback import (
    FeedbackSanitiser,
    render_confusion,
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
    PromptLayout,
    extract_prompt,
    is_degenerate,
    parse_layout,
    split_sentences,
)

__all__ = [
    "DEFAULT_WEIGHTS", "LLM_OPERATORS", "NO_LLM_WEIGHTS", "OPERATORS", "PROMPT_CLOSE", "PROMPT_OPEN",
    "RULE_OPERATORS", "CritiquePipeline", "Feedback", "FeedbackSanitiser", "MutationEngine", "Operator",
    "PromptLayout", "Scaffold", "build_llm_prompt", "candidate_text", "check_public", "extract_critique",
    "extract_prompt", "is_degenerate", "parse_layout", "render_confusion", "scrub_pii", "split_sentences",
    "truncate_text",
]
