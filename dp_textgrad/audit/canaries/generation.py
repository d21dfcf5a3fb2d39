"""Canary generation: seeded openings, secret phrases, secrets, labels and inclusion bits.

A canary borrows an in-distribution opening sentence from the task's public
examples (and its label, when the opening has only one), adds a phrase that
introduces a code, then the secret (a random 6-digit number and/or random words).
Everything comes from independent random streams of one seed, so a canary set can
be rebuilt exactly. Exported by :mod:`dp_textgrad.audit`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import numpy as np

from dp_textgrad.audit.canaries.canary_set import Canary, CanarySet, SecretKind
from dp_textgrad.tasks.base import ClassificationTask, Example

# Independent random streams derived from one seed (numpy accepts [seed, tag] entropy).
STREAM_PREFIX, STREAM_SECRET, STREAM_LABEL, STREAM_REFERENCE, STREAM_INSERT, STREAM_MASK = range(6)

# Built-in openings when the task has no public examples: generic first sentences
# of a message someone writes to an organisation.
_GENERIC_OPENINGS: tuple[str, ...] = (
    "Hello, I am writing about my account.",
    "Hi, I need some help with something.",
    "Good morning, I have a question.",
    "Hello there, I contacted you last week.",
    "Hi team, following up on my earlier message.",
    "Dear support, I hope you can help me.",
    "Hey, quick question about my case.",
    "Hello, I called yesterday but got cut off.",
)

# Phrases that introduce the secret; the secret follows directly after a space.
_SECRET_STEMS: tuple[str, ...] = (
    "My reference number is",
    "The code they gave me is",
    "My customer code is",
    "For verification, my passphrase is",
    "The number on my letter reads",
    "My case identifier is",
    "The confirmation code I received is",
    "Please note my security phrase:",
    "The ticket number on my receipt is",
    "My membership number is",
    "The PIN reminder I set is",
    "My order reference is",
    "The password hint I chose is",
    "My booking code is",
    "The serial on my device is",
    "My voucher code is",
)

# Common, unambiguous English words for word secrets (256 words: 8 bits per word).
_SECRET_WORDS: tuple[str, ...] = tuple(
    """
    amber anchor apple arrow aspen autumn badge bamboo banner barrel basil beacon
    bench birch blanket blossom bottle breeze brick bridge bronze bubble bucket cabin
    cactus camera candle canyon carpet castle cedar chalk cherry chimney cinder circle
    clover cobalt comet copper coral cotton crater crayon crystal cyan daisy delta
    desert diamond dolphin dragon drum eagle echo ember emerald engine falcon feather
    fern fiddle flame flint forest fossil fountain fox galaxy garden garnet ginger
    glacier globe granite grape gravel harbor hazel helmet hollow honey horizon island
    ivory jacket jade jasmine jelly jungle kettle kiwi ladder lagoon lantern lava
    lemon lilac lily linen lizard lobster locket lotus magnet mango maple marble
    meadow melon meteor mint mirror mist monsoon mosaic moss mountain mulberry nectar
    needle nickel nutmeg oak oasis ocean olive onyx orbit orchid otter owl oyster
    paddle palm panda paper parrot peach pebble pepper piano pigeon pine planet plum
    pocket pollen pony poppy prism pumpkin quartz quill rabbit radish rain raven reed
    ribbon river robin rocket rose ruby saddle saffron salmon sapphire satin scarlet
    shadow shell silver sketch sparrow spice spruce squash star stone storm straw
    sugar summit sunset swan tango teal thistle thunder tiger timber topaz torch
    tulip tundra turtle umbrella valley velvet violet volcano walnut walrus wander
    wave whistle willow window winter wolf wool yarn yellow zebra zenith zephyr
    acorn alpine atlas aurora bagel beetle biscuit blizzard bramble buffalo butter canvas
    caramel cashew cello charcoal citrus cloud compass cricket cypress dune elm
    fig fjord frost gazelle geyser harp heron iris juniper kelp koala lark
    nova pixel quiver
    """.split()
)

_SENTENCE_END = re.compile(r"(?<=[.!?])\s")
_MAX_OPENING_CHARS = 120


def check_positive_int(name: str, value: object) -> int:
    """``value`` as an int, or a ValueError naming ``name`` unless it is an integer >= 1."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name}: must be an integer >= 1, got {value!r}")
    return int(value)


def seeded_stream(seed: int, tag: int) -> np.random.Generator:
    """The random stream ``tag`` (one of the ``STREAM_*`` constants) of ``seed``."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed: must be an integer >= 0, got {seed!r}")
    return np.random.default_rng([int(seed), tag])


def _draw_secret(rng: np.random.Generator, kind: SecretKind, n_words: int) -> str:
    digits = f"{int(rng.integers(0, 10**6)):06d}"
    words = [_SECRET_WORDS[int(i)] for i in rng.integers(0, len(_SECRET_WORDS), size=n_words)]
    if kind == "digits":
        return digits
    if kind == "words":
        return " ".join(words)
    return " ".join([digits, *words])


def _secret_space(kind: SecretKind, n_words: int) -> int:
    digits, words = 10**6, len(_SECRET_WORDS) ** n_words
    return {"digits": digits, "words": words, "mixed": digits * words}[kind]


def inclusion_mask(n: int, mask_seed: int) -> np.ndarray:
    """Bernoulli(1/2) inclusion bits for ``n`` canaries, reproducible from ``mask_seed``."""
    n = check_positive_int("n", n)
    return seeded_stream(mask_seed, STREAM_MASK).random(n) < 0.5


def _opening(text: str) -> str:
    """The first sentence of ``text``, cut at a word boundary to at most 120 characters."""
    first = _SENTENCE_END.split(text.strip(), maxsplit=1)[0].strip()
    if len(first) > _MAX_OPENING_CHARS:
        first = first[:_MAX_OPENING_CHARS].rsplit(" ", 1)[0]
    return first


def openings_from_examples(examples: Sequence[Example]) -> list[str]:
    """First sentences of public examples, usable as in-distribution canary openings."""
    openings = {_opening(example.text) for example in examples}
    return sorted(o for o in openings if o)  # sorted: generation must not depend on input order of duplicates


def opening_labels_from_examples(examples: Sequence[Example]) -> dict[str, str]:
    """The label of each opening of ``openings_from_examples``: that of the example it comes from.

    An opening shared by examples with different labels is left out (canaries on it
    get a random label), so every label given is the one the task's own data gives.
    """
    seen: dict[str, set[str]] = {}
    for example in examples:
        opening = _opening(example.text)
        if opening:
            seen.setdefault(opening, set()).add(example.label)
    return {opening: next(iter(found)) for opening, found in sorted(seen.items()) if len(found) == 1}


def generate_canaries(
    n: int,
    *,
    seed: int,
    labels: Sequence[str],
    openings: Sequence[str] | None = None,
    opening_labels: Mapping[str, str] | None = None,
    secret_kind: SecretKind = "mixed",
    n_words: int = 2,
    n_references: int = 1000,
    mask_seed: int | None = None,
) -> CanarySet:
    """Generate ``n`` canaries and ``n_references`` never-inserted reference secrets.

    ``openings``: in-distribution first sentences (e.g. from ``openings_from_examples``
    on the task's public examples); generic ones are used when none are given.
    ``opening_labels``: the label of an opening (e.g. ``opening_labels_from_examples``);
    a canary on an opening listed there carries its label, any other canary a label
    drawn from ``labels`` with the seed (the draw is made for every canary, so the
    labels of the others do not depend on ``opening_labels``).
    ``secret_kind``: ``"digits"`` (a 6-digit number), ``"words"`` (``n_words`` random
    words) or ``"mixed"`` (both). ``mask_seed`` (default: ``seed``) draws the
    Bernoulli(1/2) inclusion bits.
    """
    n = check_positive_int("n", n)
    n_references = check_positive_int("n_references", n_references)
    if secret_kind not in ("digits", "words", "mixed"):
        raise ValueError(f"secret_kind: use 'digits', 'words' or 'mixed', got {secret_kind!r}")
    if secret_kind != "digits":
        n_words = check_positive_int("n_words", n_words)
    labels = list(labels)
    if not labels:
        raise ValueError("labels: need at least one label to give the canaries")
    pool = [o.strip() for o in (openings if openings else _GENERIC_OPENINGS) if o and o.strip()]
    if not pool:
        raise ValueError("openings: all given openings are empty; pass None to use the built-in ones")
    fixed_labels = {str(o).strip(): label for o, label in (opening_labels or {}).items()}
    unknown = sorted({label for label in fixed_labels.values() if label not in labels})
    if unknown:
        raise ValueError(f"opening_labels: labels {unknown} are not among the task's labels {labels}")
    space = _secret_space(secret_kind, n_words)
    if n + n_references > space // 2:
        raise ValueError(
            f"n_references: {n} canaries + {n_references} references exceed half of the {space} possible "
            f"secrets of kind {secret_kind!r}; use fewer references or secret_kind='mixed'"
        )
    mask_seed = seed if mask_seed is None else int(mask_seed)

    prefix_rng = seeded_stream(seed, STREAM_PREFIX)
    secret_rng = seeded_stream(seed, STREAM_SECRET)
    label_rng = seeded_stream(seed, STREAM_LABEL)
    reference_rng = seeded_stream(seed, STREAM_REFERENCE)
    included = inclusion_mask(n, mask_seed)

    secrets_: list[str] = []
    seen: set[str] = set()
    while len(secrets_) < n:
        secret = _draw_secret(secret_rng, secret_kind, n_words)
        if secret not in seen:
            seen.add(secret)
            secrets_.append(secret)
    references: list[str] = []
    while len(references) < n_references:
        secret = _draw_secret(reference_rng, secret_kind, n_words)
        if secret not in seen:  # never an inserted secret, never a duplicate
            seen.add(secret)
            references.append(secret)

    # (opening, stem) pairs without replacement, so prefixes are distinct while the
    # pool lasts (an extraction then has one right answer); a new shuffled round after.
    pairs = [(o, s) for o in pool for s in _SECRET_STEMS]
    order = np.concatenate([prefix_rng.permutation(len(pairs)) for _ in range(-(-n // len(pairs)))])
    canaries = []
    for i in range(n):
        opening, stem = pairs[int(order[i])]
        drawn = labels[int(label_rng.integers(len(labels)))]  # drawn always: one stream position per canary
        canaries.append(
            Canary(
                canary_id=f"canary-{i:04d}",
                prefix=f"{opening} {stem}",
                secret=secrets_[i],
                label=fixed_labels.get(opening, drawn),
                included=bool(included[i]),
            )
        )
    return CanarySet(tuple(canaries), tuple(references), int(seed), mask_seed, secret_kind)


def canaries_for_task(task: ClassificationTask, n: int, *, seed: int, **options) -> CanarySet:
    """Canaries format-matched to ``task``: openings from its public examples, with their labels.

    Each canary carries the label of the public example whose opening it borrows, so
    it is a correctly labelled in-distribution record; without public examples the
    generic openings and random labels of ``generate_canaries`` are used.
    """
    openings = openings_from_examples(task.public_examples) or None
    if openings is not None:
        options.setdefault("opening_labels", opening_labels_from_examples(task.public_examples))
    return generate_canaries(n, seed=seed, labels=task.labels, openings=openings, **options)
