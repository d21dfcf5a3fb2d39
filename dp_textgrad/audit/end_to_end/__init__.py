"""The L2 end-to-end canary audit of one optimisation run (``dp-textgrad audit canaries``):
:mod:`~dp_textgrad.audit.end_to_end.canary_audit` runs it (its docstring describes the audit),
:mod:`~dp_textgrad.audit.end_to_end.options` holds its settings and result types,
:mod:`~dp_textgrad.audit.end_to_end.attacks` attacks the release, and
:mod:`~dp_textgrad.audit.end_to_end.audit_file` writes and reads ``audit.json``.

Public names are exported by :mod:`dp_textgrad.audit`.
"""
