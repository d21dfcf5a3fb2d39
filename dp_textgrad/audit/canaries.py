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

The pieces: the types and file format in :mod:`dp_textgrad.audit.canary_set`,
generation in :mod:`dp_textgrad.audit.canary_generation`, insertion into a private
set in :mod:`dp_textgrad.audit.canary_insertion`; all re-exported here.
"""

from dp_textgrad.audit.canary_generation import (
    canaries_for_task,
    generate_canaries,
    inclusion_mask,
    opening_labels_from_examples,
    openings_from_examples,
)
from dp_textgrad.audit.canary_insertion import (
    DEFAULT_MAX_SHARE,
    DEFAULT_WARN_SHARE,
    CanaryInsertion,
    TwinDatasets,
    insert_canaries,
    insertion_slots,
    remove_canaries,
    twin_datasets,
    with_private_records,
)
from dp_textgrad.audit.canary_set import (
    CANARY_FILE_FORMAT,
    CANARY_FILE_VERSION,
    Canary,
    CanarySet,
    IncludeMode,
    SecretKind,
    load_canaries,
    save_canaries,
)

__all__ = [
    "CANARY_FILE_FORMAT", "CANARY_FILE_VERSION", "DEFAULT_MAX_SHARE", "DEFAULT_WARN_SHARE", "Canary",
    "CanaryInsertion", "CanarySet", "IncludeMode", "SecretKind", "TwinDatasets", "canaries_for_task",
    "generate_canaries", "inclusion_mask", "insert_canaries", "insertion_slots", "load_canaries",
    "opening_labels_from_examples", "openings_from_examples", "remove_canaries", "save_canaries", "twin_datasets",
    "with_private_records",
]
