"""L1 mechanism-level audits: many cheap runs on neighbouring datasets, one guess per run.

Neighbouring datasets (add/remove one record): D, and D plus one *canary* record that
maximally favours one candidate (clipped score C for it, 0 for every other; for the
Gaussian scorer optionally C for every candidate, the worst case of its L2
sensitivity). D is represented by public baseline utility sums ``u``: a
data-independent offset changes no sensitivity, so the guarantee for D = {} with
utilities ``u + sums`` is the guarantee of the mechanism itself. With Poisson
subsampling (q < 1) the canary is included with probability q in each run of the
"with canary" arm, so the audit measures the amplified mechanism the ledger charges.

Each audit returns a :class:`MechanismAuditResult`:

- ``claimed_epsilon``: what the library's own accountants (all five, smallest valid
  bound, :func:`dp_textgrad.privacy.accounting.smallest_bound`) say about the
  mechanism's ``.event(q)`` at ``delta``;
- ``eps_lb``: a (1 - alpha)-confidence Clopper-Pearson lower bound from
  :mod:`dp_textgrad.audit.statistics.lower_bounds`, thresholds never tuned on the evaluated scores
  (a fixed threshold for yes/no statistics, a held-out half for continuous ones);
- ``positive_control_eps_lb``: the same audit with the noise switched off. It must
  be large, or the audit could not have seen a violation.

``eps_lb > claimed_epsilon`` is a violation: the mechanism, its accounting or the
code between them is wrong (with probability at most alpha it is a false alarm).
A small ``eps_lb`` proves nothing. The ``actual_noise_factor`` argument releases
with a different noise scale than the one declared (and charged): a deliberately
broken mechanism, for checking that the audit can fail.

The audits live in :mod:`~dp_textgrad.audit.mechanism_audits.gaussian_scores`,
:mod:`~dp_textgrad.audit.mechanism_audits.selection`,
:mod:`~dp_textgrad.audit.mechanism_audits.controller_loop`, (the real scorer at q < 1)
:mod:`~dp_textgrad.audit.mechanism_audits.dp_scorer` and (the teacher vote: keyed partition,
GNMax, confident GNMax) :mod:`~dp_textgrad.audit.mechanism_audits.voting`, their shared pieces in
:mod:`~dp_textgrad.audit.mechanism_audits.trials`; :mod:`~dp_textgrad.audit.mechanism_audits.suite`
runs them all (:func:`~dp_textgrad.audit.mechanism_audits.suite.run_mechanism_audits`).
"""
