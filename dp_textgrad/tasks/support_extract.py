"""The built-in generation task: copy the account number out of a support message.

``make_support_extract_task`` generates, from a seed and without any download, messages
to the support desk of a bank-and-telecom provider (the sentences of the built-in
``support`` task, :mod:`dp_textgrad.tasks.support_templates`). Every message gives the
customer's account number exactly once, among other numbers that are not it: amounts,
dates, phone numbers, card digits, references. The answer is known by construction (the
generator put it there), and the metric is normalised exact match (``exact``).

A record is shown as ``Message: <text>\nAnswer:``: the cue does not name the field, so the
prompt has to say or show what to write. The seed prompt ("Read the message.") does not,
and the measured gap to a prompt of three public demonstrations is the room the search has
(docs/tasks.md, "Built-in generation task"). The account numbers come in three formats
(``48213307``-style digits, ``AC-1234567``, ``1234-5678-12``).

Private and test messages carry FAKE personal data (generated names, phone numbers,
addresses...). Public messages (the demonstrations a prompt may show) use placeholders
such as ``[name]`` for every personal slot except the account number, which a
demonstration needs as its answer; it is a generated fake number too.
"""

from __future__ import annotations

import random

import numpy as np

from dp_textgrad.privacy.data import PrivateDataset
from dp_textgrad.tasks.generation import GenerationExample, GenerationTask
from dp_textgrad.tasks.metrics import metric_from_name
from dp_textgrad.tasks.support_slots import SlotFiller
from dp_textgrad.tasks.support_templates import (
    CLOSINGS,
    DIRECT_REQUESTS,
    GREETINGS,
    IDENTITY_LINES,
    INDIRECT_REQUESTS,
    INTROS,
    SIGNOFFS,
    SUPPORT_LABELS,
)

SUPPORT_EXTRACT_NAME = "support_extract"
SUPPORT_EXTRACT_DESCRIPTION = (
    "Messages written by customers to the support desk of a bank and telecom provider. "
    "Each message gives the customer's account number once, among other numbers that are not it "
    "(amounts, dates, phone numbers, the last digits of a card, reference numbers). The task is to "
    "write the account number exactly as it appears in the message and nothing else. Account numbers "
    "look like 48213307 (8, 10 or 12 digits), AC-1234567 or 1234-5678-12. "
    "Private messages contain personal data (names, phone numbers, addresses)."
)
# The cue names no field: what to extract is the prompt's job (a cue "Account number:" alone
# gives the seed prompt 0.70-0.78 of the best prompt's 0.90-0.98, docs/tasks.md).
SUPPORT_EXTRACT_TEMPLATE = "Message: {text}\nAnswer:"
# Deliberately weak, as the classification task's: the search has to find the rest.
SUPPORT_EXTRACT_SEED_PROMPT = "Read the message."
# An answer is one line of at most 12 digits and two separators (about 14 model tokens).
SUPPORT_EXTRACT_MAX_NEW_TOKENS = 20
SUPPORT_EXTRACT_N_PRIVATE = 600
SUPPORT_EXTRACT_STOP = ("\n",)
# Record formats the search may try besides the template: the task's own field names, as a
# DSPy signature would name them (public; tasks.record_format). With the same demonstrations they
# scored +0.05 and +0.06 over the template, the generic ones -0.01 to -0.06 (docs/benchmarks.md).
SUPPORT_EXTRACT_RECORD_FORMATS = (
    "Message: {text}\nAccount number:",
    "Customer message: {text}\nAccount number:",
)

# Sentences that carry the account number: the support task's own ones plus a few more.
ACCOUNT_LINES: tuple[str, ...] = (
    *(line for line in INTROS + IDENTITY_LINES if "{acct}" in line),
    "Account no. {acct}.",
    "(acct {acct})",
    "My customer number is {acct} if you need it.",
    "The account is {acct}, in my name.",
)
# Numbers that are not the account number, so that "the first number" is not a rule that works.
DISTRACTOR_LINES: tuple[str, ...] = (
    "My reference from last time is {ref}.",
    "Call me on {phone}.",
    "I paid {amount2} on {date2}.",
    "The card ends in {card4}.",
    "Ticket {ref} was closed without a fix.",
)


def account_number(rng: random.Random) -> str:
    """A fake account number in one of the three public formats."""

    def digits(n: int) -> str:
        return "".join(str(rng.randrange(10)) for _ in range(n))

    kind = rng.randrange(3)
    if kind == 0:
        return digits(rng.choice((8, 10, 12)))
    if kind == 1:
        return f"AC-{digits(7)}"
    return f"{digits(4)}-{digits(4)}-{digits(2)}"


def compose_extract_message(rng: random.Random, *, with_pii: bool) -> tuple[str, str]:
    """One message and its account number; ``with_pii=False`` puts placeholders in every
    other personal slot."""
    filler = SlotFiller(rng, with_pii)
    filler["acct"] = account = account_number(rng)
    label = rng.choice(SUPPORT_LABELS)
    pool = DIRECT_REQUESTS[label] + INDIRECT_REQUESTS[label]
    # A request that names an account itself would give the number twice; it never must.
    request = rng.choice([t for t in pool if "{acct}" not in t])
    body = [request]
    if rng.random() < 0.5:
        body.insert(rng.randrange(2), rng.choice(DISTRACTOR_LINES))
    body.insert(rng.randrange(len(body) + 1), rng.choice(ACCOUNT_LINES))
    parts: list[str] = []
    if rng.random() < 0.5:
        parts.append(rng.choice(GREETINGS))
    parts += body
    if rng.random() < 0.4:
        parts.append(rng.choice(CLOSINGS))
    if rng.random() < 0.3:
        parts.append(rng.choice(SIGNOFFS))
    text = " ".join(parts).format_map(filler)
    return " ".join(text.split()), account


def generate_extract_examples(
    n: int, rng: random.Random, *, with_pii: bool, avoid: set[str]
) -> list[GenerationExample]:
    """``n`` records, no message text repeated within or across the splits sharing ``avoid``."""
    examples: list[GenerationExample] = []
    while len(examples) < n:
        text, account = compose_extract_message(rng, with_pii=with_pii)
        if text in avoid:
            continue
        avoid.add(text)
        examples.append(GenerationExample(text=text, reference=account))
    return examples


def _check_count(name: str, value: int, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name}: must be an integer >= {minimum}, got {value!r}")


def make_support_extract_task(
    seed: int = 0,
    n_private: int = SUPPORT_EXTRACT_N_PRIVATE,
    n_public: int = 40,
    n_test: int = 200,
    public_inputs: int = 0,
    max_new_tokens: int = SUPPORT_EXTRACT_MAX_NEW_TOKENS,
) -> GenerationTask:
    """The built-in generation task: the account number of a support message, scored by exact match.

    ``seed`` fixes every split, each from its own stream (changing ``n_test`` leaves the
    private records as they were). The private split goes into a ``PrivateDataset``; the
    public split (placeholders, fake account numbers) may be shown to the mutation LLM and
    used as demonstrations; the test split has the private split's distribution and is
    for research evaluation only. ``public_inputs``: how many public messages WITHOUT answers to
    add (placeholders as in the public split, from a stream of their own, default none): what a
    labelling phase (``dp.labelling``) gives DP answers to.
    """
    _check_count("seed", seed, 0)
    _check_count("public_inputs", public_inputs, 0)
    _check_count("n_private", n_private, 1)
    _check_count("n_public", n_public, 0)
    _check_count("n_test", n_test, 1)
    private_seed, public_seed, test_seed = (
        int(s.generate_state(1)[0]) for s in np.random.SeedSequence([int(seed), 34]).spawn(3)
    )
    seen: set[str] = set()
    private = generate_extract_examples(n_private, random.Random(private_seed), with_pii=True, avoid=seen)
    public = generate_extract_examples(n_public, random.Random(public_seed), with_pii=False, avoid=seen)
    test = generate_extract_examples(n_test, random.Random(test_seed), with_pii=True, avoid=seen)
    inputs_seed = int(np.random.SeedSequence([int(seed), 35]).generate_state(1)[0])
    pool = generate_extract_examples(public_inputs, random.Random(inputs_seed), with_pii=False, avoid=seen)
    return GenerationTask(
        name=SUPPORT_EXTRACT_NAME,
        description=SUPPORT_EXTRACT_DESCRIPTION,
        private_train=PrivateDataset(private),
        test=test,
        metric=metric_from_name("exact"),
        public_examples=public,
        record_template=SUPPORT_EXTRACT_TEMPLATE,
        max_new_tokens=max_new_tokens,
        stop=SUPPORT_EXTRACT_STOP,
        clip_bound=1.0,
        seed_prompt=SUPPORT_EXTRACT_SEED_PROMPT,
        public_inputs=[example.text for example in pool],
        record_formats=SUPPORT_EXTRACT_RECORD_FORMATS,
    )


__all__ = [
    "SUPPORT_EXTRACT_DESCRIPTION",
    "SUPPORT_EXTRACT_SEED_PROMPT",
    "SUPPORT_EXTRACT_TEMPLATE",
    "account_number",
    "compose_extract_message",
    "generate_extract_examples",
    "make_support_extract_task",
]
