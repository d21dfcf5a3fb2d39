"""Public text the MutationEngine may use: phrases, format instructions and worked examples.

Everything here was written for this library and contains no data from any user
or dataset, so it is public by construction. A MutationEngine uses only the phrases whose
words its task's public text also uses (``readable.py``): the message-oriented ones do
not reach a film-review task. Rule edits insert these phrases into
candidate prompts, and the LLM prompts use the worked examples as few-shot
patterns that a small base model (Gemma 3 270M) can continue.
"""

from __future__ import annotations

# Generic advice sentences for classification instructions (rule edit "insert_phrase").
INSTRUCTION_PHRASES: tuple[str, ...] = (
    "Read the whole message before deciding.",
    "Focus on what the writer is asking for, not on side details.",
    "If several labels seem possible, choose the one that matches the main request.",
    "Ignore names, numbers and other personal details.",
    "Decide from the main problem the writer describes.",
    "Think about why the person is writing.",
    "Pay attention to the key words that describe the problem.",
    "Do not guess from the tone of the message; use its content.",
    "Look at the first and last sentences, where the request is usually stated.",
    "Choose the most specific label that fits.",
    "Be careful with messages that mention more than one topic.",
    "Use the label that the support desk would give the message.",
)

# Output-format instructions (rule edit "format_change"). One of them at most is kept.
FORMAT_INSTRUCTIONS: tuple[str, ...] = (
    "Answer with the label only.",
    "Reply with a single word: the label.",
    "Write only the category name, nothing else.",
    "Output just the label, in lower case.",
    "Give the label without any explanation.",
)

# Verbaliser hints (rule edit "verbaliser_hint"); {labels} is a public list of label names.
VERBALISER_HINTS: tuple[str, ...] = (
    "Answer with exactly one of: {labels}.",
    "The possible labels are: {labels}.",
    "Choose one label from: {labels}.",
    "Valid answers: {labels}.",
)

# Few-shot worked examples for the base-model rewrite prompt: (task, instruction, feedback, improved).
REWRITE_EXAMPLES: tuple[tuple[str, str, str, str], ...] = (
    (
        "Sort customer emails about an online shop into order, delivery or account.",
        "Classify the email.",
        "About 30% of 'delivery' messages are labelled 'order'.",
        "Classify the customer email as order, delivery or account. "
        "Questions about where a parcel is or when it arrives are delivery, even if they mention the order.",
    ),
    (
        "Tell whether a product review is positive or negative.",
        "Is this review good or bad? Think step by step and explain.",
        "About 25% of 'negative' reviews are labelled 'positive'.",
        "Decide if the review is positive or negative. "
        "Polite reviews can still be negative; judge what the writer thinks of the product. Answer with one word.",
    ),
)

# Few-shot worked example for the crossover prompt: (task, instruction A, instruction B, combined).
CROSSOVER_EXAMPLES: tuple[tuple[str, str, str, str], ...] = (
    (
        "Sort customer emails about an online shop into order, delivery or account.",
        "Classify the email by its topic. Answer with the label only.",
        "Questions about where a parcel is are delivery. Ignore greetings and signatures.",
        "Classify the email by its topic. Questions about where a parcel is are delivery. Answer with the label only.",
    ),
)

# Few-shot worked examples for the critique prompt: (task, instruction, statistics, advice).
CRITIQUE_EXAMPLES: tuple[tuple[str, str, str, str], ...] = (
    (
        "Sort customer emails about an online shop into order, delivery or account.",
        "Classify the email.",
        "About 30% of 'delivery' messages are labelled 'order'.",
        "Explain that questions about where a parcel is belong to delivery, even when they mention an order.",
    ),
    (
        "Tell whether a product review is positive or negative.",
        "Is this review good or bad?",
        "'positive' is predicted much more often than it occurs.",
        "Say that polite wording does not make a review positive and list both labels.",
    ),
)
