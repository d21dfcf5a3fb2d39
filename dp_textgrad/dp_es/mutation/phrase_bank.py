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

# The same two banks for prompts that generate (extraction, answers, replies): no label, category or
# class words, which a generation prompt must never carry (a classification phrase in an extraction
# prompt tells the model to answer with a category).
GENERATION_PHRASES: tuple[str, ...] = (
    "Read the whole input before answering.",
    "Copy the answer exactly as it is written in the input.",
    "Give only what is asked for, not the rest of the input.",
    "If the input holds several candidates, choose the one that is asked for.",
    "Keep the answer short.",
    "Ignore greetings and other details that do not answer the request.",
    "Use the same form as in the examples.",
    "Look for the part of the input that answers the request.",
)
GENERATION_FORMATS: tuple[str, ...] = (
    "Write only the answer, nothing else.",
    "Reply with the answer on one line.",
    "Give the answer without any explanation.",
    "Output just the requested text.",
)


def phrase_banks(family: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(advice phrases, output-format instructions) for a task family: ``classify`` or ``generate``."""
    if family == "generate":
        return GENERATION_PHRASES, GENERATION_FORMATS
    if family == "classify":
        return INSTRUCTION_PHRASES, FORMAT_INSTRUCTIONS
    raise ValueError(f"family: use 'classify' or 'generate', got {family!r}")


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

# The same worked examples for prompts that generate: the rewrite and crossover prompts of a
# generation task show these instead, so a base model continues an extraction pattern, not a label one.
GENERATION_REWRITE_EXAMPLES: tuple[tuple[str, str, str, str], ...] = (
    (
        "Copy the order number out of a customer's email.",
        "Read the email.",
        "About 40% of the answers are 'wrong_answer' and 20% are 'too_long'.",
        "Find the order number in the email and write it exactly as it appears, with nothing else.",
    ),
    (
        "Write the city a traveller wants to fly to, from a booking request.",
        "What does the traveller want? Explain your answer.",
        "About 35% of the answers are 'extra_text'.",
        "Write only the destination city of the request, one or two words, with no explanation.",
    ),
)
GENERATION_CROSSOVER_EXAMPLES: tuple[tuple[str, str, str, str], ...] = (
    (
        "Copy the order number out of a customer's email.",
        "Find the order number in the email. Write nothing else.",
        "Order numbers start with two letters. Ignore phone numbers and dates.",
        "Find the order number in the email; it starts with two letters. Ignore phone numbers and dates. "
        "Write nothing else.",
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
