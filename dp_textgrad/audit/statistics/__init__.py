"""The statistics of an audit: empirical epsilon LOWER bounds from membership guesses
(:mod:`~dp_textgrad.audit.statistics.lower_bounds` over many runs,
:mod:`~dp_textgrad.audit.statistics.one_run` from one run), the Gaussian-DP estimate
(:mod:`~dp_textgrad.audit.statistics.gdp`, never a bound), and the attack metrics with
their uncertainty (:mod:`~dp_textgrad.audit.statistics.metrics`: ROC/PR AUC, TPR at low FPR,
bootstrap intervals, effect sizes).

The UPPER bounds the ledger charges are elsewhere (:mod:`dp_textgrad.privacy.accounting`).
Public names are exported by :mod:`dp_textgrad.audit`.
"""
