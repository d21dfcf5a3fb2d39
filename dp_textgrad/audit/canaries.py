"""Canaries: synthetic records with a high-entropy secret, planted to measure leakage.

A canary looks like one of the task's records (an in-distribution opening sentence,
a phrase that introduces a code, then the secret). Its label is that of the public
example whose opening it borrows, so a canary is a correctly labelled record of the
task (a demonstration built from it is a right one); only canaries on an opening
without a label (the built-in generic openings, or an opening that public examples
with different labels share) get a label drawn at random from the task's labels.
Its secret (a random 6-digit number and/or random words) is what an attacker
tries to recover; a universe of never-inserted *reference* secrets of the same
format gives the exposure metric its denominator.

Everything is generated from a seed, so a canary set can be rebuilt exactly, and
saved to / loaded from JSON. Each canary also carries a Bernoulli(1/2) inclusion
bit (drawn from ``mask_seed``) for one-run audits: included canaries are inserted,
excluded ones are the non-members that the attacker must tell apart.

Canary secrets are the auditor's own synthetic data, not users' private records,
so they may be saved; keep the canary file away from the optimiser.
"""

from __future__ import annotations

import dataclasses
import json
import re
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from dp_textgrad import _io
from dp_textgrad.privacy.data import PrivateDataset
from dp_textgrad.tasks.base import ClassificationTask, Example

SecretKind = Literal["digits", "words", "mixed"]
IncludeMode = Literal["all", "mask"]

CANARY_FILE_FORMAT = "dp-textgrad-canaries"
CANARY_FILE_VERSION = 1
DEFAULT_WARN_SHARE = 0.008
DEFAULT_MAX_SHARE = 0.01

# Independent random streams derived from one seed (numpy accepts [seed, tag] entropy).
_STREAM_PREFIX, _STREAM_SECRET, _STREAM_LABEL, _STREAM_REFERENCE, _STREAM_INSERT, _STREAM_MASK = range(6)

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


@dataclass(frozen=True)
class Canary:
    """One canary record: ``prefix`` (public-looking text) then `` secret``.

    ``text`` is the record as inserted; ``continuation`` is what an extraction
    attack must produce after ``prefix``. ``included`` is the one-run inclusion bit.
    """

    canary_id: str
    prefix: str
    secret: str
    label: str
    included: bool = True

    @property
    def continuation(self) -> str:
        # The separating space starts the continuation, so piece boundaries are token boundaries.
        return " " + self.secret

    @property
    def text(self) -> str:
        return f"{self.prefix}{self.continuation}."

    @property
    def example(self) -> Example:
        return Example(text=self.text, label=self.label)


@dataclass(frozen=True)
class CanarySet:
    """A seeded set of canaries plus the reference secrets used for exposure."""

    canaries: tuple[Canary, ...]
    reference_secrets: tuple[str, ...]
    seed: int
    mask_seed: int
    secret_kind: SecretKind

    def __len__(self) -> int:
        return len(self.canaries)

    def __iter__(self) -> Iterator[Canary]:
        return iter(self.canaries)

    def __getitem__(self, index: int) -> Canary:
        return self.canaries[index]

    @property
    def included_mask(self) -> np.ndarray:
        return np.array([c.included for c in self.canaries], dtype=bool)

    def members(self) -> list[Canary]:
        """Canaries whose inclusion bit is set (inserted in a one-run audit)."""
        return [c for c in self.canaries if c.included]

    def non_members(self) -> list[Canary]:
        return [c for c in self.canaries if not c.included]

    def examples(self, include: IncludeMode = "all") -> list[Example]:
        chosen = self.canaries if include == "all" else self.members()
        return [c.example for c in chosen]

    def to_dict(self) -> dict:
        return {
            "format": CANARY_FILE_FORMAT,
            "version": CANARY_FILE_VERSION,
            "seed": self.seed,
            "mask_seed": self.mask_seed,
            "secret_kind": self.secret_kind,
            "canaries": [dataclasses.asdict(c) for c in self.canaries],
            "reference_secrets": list(self.reference_secrets),
        }

    @classmethod
    def from_dict(cls, payload: dict) -> "CanarySet":
        parsed = _CanarySetFile.model_validate(payload)
        return cls(
            canaries=tuple(Canary(**c.model_dump()) for c in parsed.canaries),
            reference_secrets=tuple(parsed.reference_secrets),
            seed=parsed.seed,
            mask_seed=parsed.mask_seed,
            secret_kind=parsed.secret_kind,
        )


# -- file schema (pydantic at the edge) ------------------------------------------------


class _CanaryModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    canary_id: str = Field(min_length=1)
    prefix: str
    secret: str = Field(min_length=1)
    label: str = Field(min_length=1)
    included: bool


class _CanarySetFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format: Literal["dp-textgrad-canaries"]
    version: Literal[1]
    seed: int
    mask_seed: int
    secret_kind: SecretKind
    canaries: list[_CanaryModel] = Field(min_length=1)
    reference_secrets: list[str] = Field(min_length=1)

    @model_validator(mode="after")
    def _consistent(self) -> "_CanarySetFile":
        ids = [c.canary_id for c in self.canaries]
        if len(set(ids)) != len(ids):
            raise ValueError("canaries: canary ids must be unique")
        secrets_ = {c.secret for c in self.canaries}
        if len(secrets_) != len(self.canaries):
            raise ValueError("canaries: canary secrets must be unique")
        if secrets_ & set(self.reference_secrets):
            raise ValueError("reference_secrets: must not contain an inserted canary secret")
        if len(set(self.reference_secrets)) != len(self.reference_secrets):
            raise ValueError("reference_secrets: must be unique")
        return self


def save_canaries(path: str | Path, canary_set: CanarySet) -> None:
    """Write the canary set as JSON (atomically)."""
    _io.atomic_write_json(path, canary_set.to_dict())


def load_canaries(path: str | Path) -> CanarySet:
    return CanarySet.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))


# -- generation ----------------------------------------------------------------------


def _check_positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name}: must be an integer >= 1, got {value!r}")
    return int(value)


def _stream(seed: int, tag: int) -> np.random.Generator:
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
    n = _check_positive_int("n", n)
    return _stream(mask_seed, _STREAM_MASK).random(n) < 0.5


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
    n = _check_positive_int("n", n)
    n_references = _check_positive_int("n_references", n_references)
    if secret_kind not in ("digits", "words", "mixed"):
        raise ValueError(f"secret_kind: use 'digits', 'words' or 'mixed', got {secret_kind!r}")
    if secret_kind != "digits":
        n_words = _check_positive_int("n_words", n_words)
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

    prefix_rng = _stream(seed, _STREAM_PREFIX)
    secret_rng = _stream(seed, _STREAM_SECRET)
    label_rng = _stream(seed, _STREAM_LABEL)
    reference_rng = _stream(seed, _STREAM_REFERENCE)
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


# -- insertion -------------------------------------------------------------------------


@dataclass(frozen=True)
class CanaryInsertion:
    """A dataset with canaries inserted, and where they went.

    ``positions[j]`` is the index in ``records`` of the canary ``canary_ids[j]``.
    ``interval`` = len(original records) // number of canaries; ``share`` is the
    fraction of ``records`` that are canaries.
    """

    records: tuple[Example, ...]
    positions: tuple[int, ...]
    canary_ids: tuple[str, ...]
    interval: int
    share: float


def insertion_slots(n_records: int, n_canaries: int, seed: int) -> list[int]:
    """For each canary, the index of the original record it is inserted before.

    Canary j goes before record ``j * interval + offset`` with ``interval =
    n_records // n_canaries`` and a seeded ``offset`` in [0, interval): evenly spread.
    """
    n_canaries = _check_positive_int("n_canaries", n_canaries)
    interval = n_records // n_canaries
    if interval < 1:
        raise ValueError(
            f"records: {n_canaries} canaries need at least {n_canaries} records to spread over, "
            f"got {n_records}; use fewer canaries or more records"
        )
    offset = int(_stream(seed, _STREAM_INSERT).integers(interval))
    return [j * interval + offset for j in range(n_canaries)]


def insert_canaries(
    records: Sequence[Example],
    canary_set: CanarySet,
    *,
    include: IncludeMode = "all",
    warn_share: float = DEFAULT_WARN_SHARE,
    max_share: float = DEFAULT_MAX_SHARE,
    seed: int | None = None,
) -> CanaryInsertion:
    """Insert the canaries evenly among ``records`` (which must hold no canaries).

    ``include="all"`` inserts every canary (many-run audits); ``"mask"`` only those
    with the inclusion bit set (one-run audits). Slots are computed for all canaries
    either way, so the mask changes nothing else. A canary share above
    ``warn_share`` warns, above ``max_share`` raises. ``seed`` (default: the canary
    set's seed) fixes the offset of the slots.
    """
    if include not in ("all", "mask"):
        raise ValueError(f"include: use 'all' or 'mask', got {include!r}")
    if not 0 < warn_share <= max_share <= 1:
        raise ValueError(f"warn_share, max_share: need 0 < warn_share <= max_share <= 1, got {warn_share}, {max_share}")
    records = list(records)
    slots = insertion_slots(len(records), len(canary_set), canary_set.seed if seed is None else seed)
    chosen = [(slot, c) for slot, c in zip(slots, canary_set) if include == "all" or c.included]
    share = len(chosen) / (len(records) + len(chosen)) if chosen else 0.0
    if share > max_share:
        raise ValueError(
            f"max_share: {len(chosen)} canaries would be {share:.2%} of the {len(records) + len(chosen)} records, "
            f"above the limit of {max_share:.2%}; use fewer canaries, more records, or raise max_share"
        )
    if share > warn_share:
        warnings.warn(
            f"canaries are {share:.2%} of the private set (warning threshold {warn_share:.2%}); they may "
            "change what the optimiser learns",
            stacklevel=2,
        )
    merged: list[Example] = []
    positions: list[int] = []
    ids: list[str] = []
    pending = iter(chosen)
    nxt = next(pending, None)
    for index, record in enumerate(records):
        while nxt is not None and nxt[0] == index:
            positions.append(len(merged))
            ids.append(nxt[1].canary_id)
            merged.append(nxt[1].example)
            nxt = next(pending, None)
        merged.append(record)
    return CanaryInsertion(tuple(merged), tuple(positions), tuple(ids), len(records) // len(canary_set), share)


def remove_canaries(insertion: CanaryInsertion) -> list[Example]:
    """The records of ``insertion`` without its canaries, in order."""
    drop = set(insertion.positions)
    return [r for i, r in enumerate(insertion.records) if i not in drop]


@dataclass(frozen=True)
class TwinDatasets:
    """The same private records with and without canaries."""

    with_canaries: CanaryInsertion
    without_canaries: tuple[Example, ...]


def twin_datasets(records: Sequence[Example], canary_set: CanarySet, **insert_options) -> TwinDatasets:
    """A with-canary dataset and its canary-free twin (identical otherwise)."""
    insertion = insert_canaries(records, canary_set, **insert_options)
    return TwinDatasets(insertion, tuple(records))


def with_private_records(task: ClassificationTask, records: Sequence[Example]) -> ClassificationTask:
    """A copy of ``task`` whose private set is ``records`` (e.g. one side of a twin pair).

    The auditor supplies the records (the same list the task was built from), so the
    audit never has to read the task's private set.
    """
    return dataclasses.replace(task, private_train=PrivateDataset(list(records)))
