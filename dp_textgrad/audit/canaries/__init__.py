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

The modules: the types and file format in :mod:`~dp_textgrad.audit.canaries.canary_set`,
generation in :mod:`~dp_textgrad.audit.canaries.generation`, insertion into a private
set in :mod:`~dp_textgrad.audit.canaries.insertion`. Their public names are exported
by :mod:`dp_textgrad.audit`.
"""
