"""The built-in private task: customer-support messages with fake personal data.

``make_support_task`` generates, from a seed and without any download, messages
sent to the support desk of a bank-and-telecom provider. Each message has one
intent, named by a short label: ``bill`` (charges, fees, refunds), ``tech`` (something
does not work), ``cancel`` (ending a service or account), ``fraud`` (unauthorised use,
scams, stolen cards) and ``update`` (changing personal details).
Private and test messages carry FAKE personal data (generated names, phone and
account numbers, e-mail and street addresses, dates, amounts); the public split
uses placeholders such as ``[name]`` instead, so it holds no personal data at all.

Why it is not a keyword task: a share of the messages (``hard_fraction``) is
built so that the obvious keyword points to the wrong label:

- negations ("This isn't about my bill." before a ``tech`` request);
- a second, background topic ("I sorted my bill out last week." then a fraud report),
  or a threat that is not the request ("... or I will cancel" on a billing complaint);
- indirect phrasing without the label's usual words ("the light on the box keeps
  flashing orange" is tech).

Label words: Gemma 3 270M (the default local model) is scored on the log-probability
of each label word after "Category:". With the longer names "billing", "technical",
"cancellation", "account" it almost never predicted "technical" or "cancellation"
under any prompt we tried, and "account" is copied from every "my account number is"
line; the short words above are the set where prompts make the largest difference
(see docs/tasks.md for the measurements).

All other variety (greetings, sign-offs, politeness, lower-case, typos, lengths)
is added around the request. Everything is drawn from ``random.Random`` streams
derived from the seed with ``numpy.random.SeedSequence``, so a seed fixes the task.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np

from dp_textgrad.privacy.data import PrivateDataset
from dp_textgrad.tasks.base import ClassificationTask, Example, ScoreKind
from dp_textgrad.tasks.support_messages import generate_messages, private_style, public_style
from dp_textgrad.tasks.support_slots import FIRST_NAMES as FIRST_NAMES  # re-exported: tests detect names
from dp_textgrad.tasks.support_slots import LAST_NAMES as LAST_NAMES
from dp_textgrad.tasks.support_templates import SUPPORT_LABELS

# This module is the task; the message generator behind it is split by concern:
# support_slots (fake personal data, placeholders), support_templates (the sentences)
# and support_messages (composing messages from them).

SUPPORT_DESCRIPTION = (
    "Messages written by customers to the support desk of a bank and telecom provider. "
    "Each message has one main request, and the task is to name its category with one word: "
    "bill (wrong charges, bills, fees, refunds, payments), "
    "tech (a service, device, app or connection not working), "
    "cancel (ending a contract, subscription, line or account), "
    "fraud (unauthorised payments, scams, phishing, lost or stolen cards, someone else in the account), "
    "update (changing personal details such as address, phone number, e-mail, name or login). "
    "Messages may mention other topics in passing or deny them; only the main request counts. "
    "Private messages contain personal data (names, phone and account numbers, addresses)."
)

SUPPORT_RECORD_TEMPLATE = "Message: {text}\nCategory:"

# Deliberately weak: no label list, no definition; the optimiser must find the rest.
SUPPORT_SEED_PROMPT = "Read the message."

# Default share of messages built to defeat keyword matching (see the module docstring).
DEFAULT_HARD_FRACTION = 0.45


def generate_support_examples(
    n: int, seed: int, *, public: bool = False, hard_fraction: float = DEFAULT_HARD_FRACTION
) -> list[Example]:
    """Support messages without building a task (``public=True``: placeholders, no personal data)."""
    style = public_style(hard_fraction) if public else private_style(hard_fraction)
    return generate_messages(n, random.Random(seed), style, set())


def _check_count(name: str, value: int, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name}: must be an integer >= {minimum}, got {value!r}")


def make_support_task(
    seed: int = 0,
    n_private: int = 600,
    n_public: int = 40,
    n_test: int = 200,
    score_kind: ScoreKind = "accuracy",
    *,
    hard_fraction: float = DEFAULT_HARD_FRACTION,
    public_inputs: int = 0,
) -> ClassificationTask:
    """The built-in private customer-support task (5 intents, fake personal data).

    ``seed`` fixes every split. The private split goes into a ``PrivateDataset``;
    the public split (placeholders instead of personal data) may be shown to the
    mutation LLM and used as few-shot demonstrations; the test split has the same
    distribution as the private one and is for research evaluation only.
    ``hard_fraction`` is the share of messages built to defeat keyword matching.

    ``public_inputs``: how many public unlabelled messages to generate (default none), the
    pool a labelling phase (``dp.labelling``) gives DP labels to. They are public: written
    like the public split (placeholders, no personal data) from a fourth stream of ``seed``,
    disjoint from the other three, and kept apart from the private and test messages (only the
    public split's texts are avoided), so they are a function of public code and the seed alone;
    their labels are dropped. Adding them changes no other split.
    """
    _check_count("seed", seed, 0)
    _check_count("n_private", n_private, 1)
    _check_count("n_public", n_public, 0)
    _check_count("n_test", n_test, 1)
    _check_count("public_inputs", public_inputs, 0)
    if not 0.0 <= float(hard_fraction) <= 1.0:
        raise ValueError(f"hard_fraction: must be in [0, 1], got {hard_fraction!r}")
    # Independent streams per split, so changing n_test does not change the private records.
    # (SeedSequence children are numbered: the fourth, of the unlabelled pool, leaves the first three as they were.)
    private_seed, public_seed, test_seed, inputs_seed = (
        int(s.generate_state(1)[0]) for s in np.random.SeedSequence(int(seed)).spawn(4)
    )
    seen: set[str] = set()
    private = generate_messages(n_private, random.Random(private_seed), private_style(hard_fraction), seen)
    public = generate_messages(n_public, random.Random(public_seed), public_style(hard_fraction), seen)
    test = generate_messages(n_test, random.Random(test_seed), private_style(hard_fraction), seen)
    # The unlabelled pool avoids the public split's texts only: nothing of the private split steers it.
    pool = generate_messages(
        public_inputs, random.Random(inputs_seed), public_style(hard_fraction), {ex.text for ex in public}
    )
    return ClassificationTask(
        name="support",
        description=SUPPORT_DESCRIPTION,
        labels=list(SUPPORT_LABELS),
        private_train=PrivateDataset(private),
        test=test,
        public_examples=public,
        verbalizers={label: " " + label for label in SUPPORT_LABELS},
        record_template=SUPPORT_RECORD_TEMPLATE,
        score_kind=score_kind,
        clip_bound=1.0,
        seed_prompt=SUPPORT_SEED_PROMPT,
        public_inputs=[ex.text for ex in pool],
    )


# ----------------------------------------------------------------------------------
# Prompts built from public text only (safe to print, to optimise from, to put in docs).
SUPPORT_REFERENCE_INSTRUCTION = "Sort each customer message into one category: bill, tech, cancel, fraud, update."

# Hand-written demonstrations (placeholders, no personal data), in a fixed order. The
# small model copies the label of the last demonstrations, so order matters: this one
# was chosen among 16 random orders/subsets of a 20-message pool (with or without the
# label list) by accuracy on the test split of seed 1, then checked on seeds 0 and 2
# (docs/tasks.md).
SUPPORT_REFERENCE_DEMOS: tuple[Example, ...] = (
    Example("Please send my statements to [email] from now on.", "update"),
    Example("I'm switching to another provider, how do I end my contract?", "cancel"),
    Example("There is a payment of [amount] on my card that I did not make.", "fraud"),
    Example("I'm not looking to cancel, but someone logged into my account from another country.", "fraud"),
    Example("The light on the router has been flashing orange since [date].", "tech"),
    Example("I've moved, please change my address to [address].", "update"),
    Example("I got married and my surname is now [last name].", "update"),
    Example("I'm moving abroad on [date] and won't need the line after that.", "cancel"),
    Example("My card ending [card digits] was stolen, please block it.", "fraud"),
    Example("The app crashes every time I try to log in.", "tech"),
    Example("This isn't about my bill, my phone has had no signal for two days.", "tech"),
    Example("I'm not saying it's fraud, I just don't understand the extra charge on my statement.", "bill"),
    Example("My new phone number is [phone].", "update"),
    Example("My broadband keeps dropping every evening.", "tech"),
    Example("Please cancel my TV package at the end of the month.", "cancel"),
)


def reference_prompt(task: ClassificationTask, *, with_label_list: bool = False) -> str:
    """The measured "good prompt" of the support task: 15 fixed public demonstrations.

    ``with_label_list`` puts ``SUPPORT_REFERENCE_INSTRUCTION`` (a label list) first; on
    Gemma 3 270M that scores lower (the model copies the listed words), see docs/tasks.md.
    """
    shots = "\n\n".join(task.render_demo(ex) for ex in SUPPORT_REFERENCE_DEMOS)
    return f"{SUPPORT_REFERENCE_INSTRUCTION}\n\n{shots}" if with_label_list else shots


def demo_prompt(task: ClassificationTask, n_demos: int, instruction: str = "") -> str:
    """``instruction`` plus ``n_demos`` of the task's public examples, spread evenly over the labels."""
    demos = _spread_over_labels(task.public_examples, task.labels, n_demos)
    parts = [instruction.strip()] if instruction.strip() else []
    parts += [task.render_demo(ex) for ex in demos]
    return "\n\n".join(parts)


def _spread_over_labels(examples: Sequence[Example], labels: Sequence[str], n: int) -> list[Example]:
    """Up to ``n`` examples covering the labels evenly, kept in their original order.

    Keeping the (shuffled) public order avoids always ending on the same label, which
    small models would copy.
    """
    queues = {label: [i for i, ex in enumerate(examples) if ex.label == label] for label in labels}
    chosen: list[int] = []
    while len(chosen) < n and any(queues.values()):
        for label in labels:
            if queues[label] and len(chosen) < n:
                chosen.append(queues[label].pop(0))
    return [examples[i] for i in sorted(chosen)]
