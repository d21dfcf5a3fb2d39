"""What a released prompt gives away about a record: leakage measures
(:mod:`~dp_textgrad.audit.membership.leakage`: a secret in the prompt text, greedy extraction,
top-k hit rates, exposure) and membership-inference scores
(:mod:`~dp_textgrad.audit.membership.inference`: LOSS, zlib, Min-K%, Min-K%++, reference,
ReCaLL).

Public names are exported by :mod:`dp_textgrad.audit`.
"""
