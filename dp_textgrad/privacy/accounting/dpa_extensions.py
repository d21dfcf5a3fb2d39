"""dp-accounting's own RDP and PLD accountants, taught to read our pure-DP events.

dp-accounting 0.6.0 has no pure-DP or Gumbel top-k event. The subclasses here add them
(also under Poisson subsampling: the tight dominating pair for PLD, Zhu-Wang's bound
or amplification for RDP) and otherwise defer to the parent,
so every event dp-accounting knows keeps its exact treatment.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import dp_accounting
import numpy as np
from dp_accounting import dp_event as dpe
from dp_accounting.pld import pld_pmf
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.pld.pld_privacy_accountant import PLDAccountant as _DpaPldAccountant
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

from dp_textgrad.privacy.accounting.events import (
    GumbelTopKDpEvent,
    PureDpEvent,
    contains_own_event,
    effective_noise_multiplier_of,
    pure_epsilon_of,
)
from dp_textgrad.privacy.accounting.subsampled_rdp import poisson_subsampled_rdp

NEIGHBOURS = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
HUGE_EPSILON = 500.0  # beyond this e^eps overflows floats; such bounds are reported as inf
CompositionError = dp_accounting.PrivacyAccountant.CompositionErrorDetails
# dp-accounting 0.6's PLD of a Poisson-subsampled Gaussian raises (log of a difference of two
# equal logs) when z is small and q is within ~1e-12 of 1; above 1 - this, q is read as 1.
_Q_READ_AS_ONE = 1e-9


# --------------------------------------------------------------------------- RDP curves


def pure_dp_rdp(epsilon: float, orders: Sequence[float] | np.ndarray) -> np.ndarray:
    """Tight RDP of an epsilon-DP mechanism at each order.

    Every epsilon-DP pair of output distributions is a post-processing of binary
    randomized response with p = e^eps / (1 + e^eps) (Kairouz-Oh-Viswanath 2015,
    Thm 2.1), and Renyi divergence obeys data processing, so
    D_a <= log((e^{a eps} + e^{(1-a) eps}) / (1 + e^eps)) / (a - 1).
    """
    a = np.asarray(orders, dtype=np.float64)
    eps = float(epsilon)
    if eps == 0.0:
        return np.zeros_like(a)
    if math.isinf(eps):
        return np.full_like(a, np.inf)
    out = np.empty_like(a)
    at_one = a == 1.0
    at_inf = np.isinf(a)
    general = ~(at_one | at_inf)
    ag = a[general]
    out[general] = (np.logaddexp(ag * eps, (1.0 - ag) * eps) - np.logaddexp(0.0, eps)) / (ag - 1.0)
    out[at_one] = eps * math.tanh(eps / 2.0)  # KL divergence, the a -> 1 limit
    out[at_inf] = eps
    return np.clip(out, 0.0, eps)  # exact value lies in [0, eps]; clip rounding only


def _gumbel_top_k_rdp(epsilon0: float, k: int, orders: np.ndarray) -> np.ndarray:
    """Minimum of three valid curves for one-shot Gumbel top-k (= k exponential mechanisms).

    k-fold composition of eps0-DP, (k eps0)-DP as a whole, and bounded range:
    k eps0^2 / 8 zCDP, i.e. rho * a (Cesar-Rogers 2021).
    """
    rho = k * epsilon0**2 / 8.0
    return np.minimum.reduce([k * pure_dp_rdp(epsilon0, orders), pure_dp_rdp(k * epsilon0, orders), rho * orders])


# --------------------------------------------------------------------------- dp-accounting extensions


class ExtendedRdpAccountant(rdp_lib.RdpAccountant):
    """dp-accounting's RDP accountant that also reads PureDp / GumbelTopK (also Poisson-sampled)."""

    _rdp: np.ndarray  # the base class's running RDP curve, one value per order

    def __init__(self, orders: Sequence[float] | np.ndarray) -> None:
        super().__init__(orders=list(orders), neighboring_relation=NEIGHBOURS)

    def _add(self, curve: np.ndarray, count: int) -> None:
        self._rdp = self._rdp + count * curve

    def _subsampled_pure_curve(self, event: dpe.PoissonSampledDpEvent, amplified: float) -> np.ndarray:
        """The smaller of two valid curves: RR of the amplified epsilon, and Zhu-Wang's
        subsampled RDP of the inner event's own curve (bounded range for Gumbel top-k)."""
        orders = np.asarray(self._orders, dtype=np.float64)
        amplified_curve = pure_dp_rdp(amplified, orders)

        def inner_curve(integer_orders: np.ndarray) -> np.ndarray:
            inner = ExtendedRdpAccountant(integer_orders)
            inner.compose(event.event, 1)
            return np.asarray(inner._rdp, dtype=np.float64)

        subsampled = poisson_subsampled_rdp(inner_curve, float(event.sampling_probability), orders)
        return np.minimum(amplified_curve, subsampled)

    def _maybe_compose(
        self, event: dpe.DpEvent, count: int, do_compose: bool
    ) -> dp_accounting.PrivacyAccountant.CompositionErrorDetails | None:
        if isinstance(event, PureDpEvent):
            if do_compose:
                self._add(pure_dp_rdp(event.epsilon, self._orders), count)
            return None
        if isinstance(event, GumbelTopKDpEvent):
            if do_compose:
                self._add(_gumbel_top_k_rdp(float(event.epsilon0), int(event.k), self._orders), count)
            return None
        if isinstance(event, dpe.PoissonSampledDpEvent) and not _supported_by_dp_accounting(
            super()._maybe_compose, event
        ):
            amplified = pure_epsilon_of(event)
            if amplified is None:
                return CompositionError(event, "Poisson-sampled subevent must be Gaussian(s) or pure DP")
            if do_compose:
                self._add(self._subsampled_pure_curve(event, amplified), count)
            return None
        return super()._maybe_compose(event, count, do_compose)


def pure_picks(event: dpe.DpEvent) -> list[float] | None:
    """The per-step epsilons of an event made only of pure-DP steps (run adaptively), else None."""
    if isinstance(event, PureDpEvent):
        return [float(event.epsilon)]
    if isinstance(event, GumbelTopKDpEvent):  # one-shot top-k = k adaptive eps0-DP picks (peeling)
        return [float(event.epsilon0)] * int(event.k)
    if isinstance(event, dpe.SelfComposedDpEvent):
        inner = pure_picks(event.event)
        return None if inner is None else inner * int(event.count)
    if isinstance(event, dpe.ComposedDpEvent):
        picks: list[float] = []
        for sub in event.events:
            inner = pure_picks(sub)
            if inner is None:
                return None
            picks += inner
        return picks
    return None


def subsampled_pure_dp_pmfs(epsilon0: float, picks: int, q: float) -> tuple[dict[int, float], dict[int, float]]:
    """Log-pmfs of the tight dominating pair of ``picks`` adaptive eps0-DP steps run on one
    Poisson subsample of rate q (add/remove neighbours): (q P + (1 - q) Q, Q).

    (P, Q) = (A^picks, B^picks) with A, B the randomized-response pair of eps0: every
    adaptive composition of eps0-DP steps is a post-processing of it (Kairouz, Oh and
    Viswanath 2015), and Poisson subsampling turns a dominating pair (P, Q) into
    (q P + (1 - q) Q, Q) for removal and its mirror for addition (Zhu, Dong and Wang
    2022). By symmetry only the number j of "flipped" answers matters: binomial outcomes.
    """
    log_p = -float(np.logaddexp(0.0, -epsilon0))  # log e^eps / (1 + e^eps), stable for large eps
    log_not_p = -float(np.logaddexp(0.0, epsilon0))
    log_q, log_not_q = math.log(q), (math.log1p(-q) if q < 1.0 else -math.inf)
    upper: dict[int, float] = {}
    lower: dict[int, float] = {}
    for j in range(picks + 1):
        log_choose = math.lgamma(picks + 1) - math.lgamma(j + 1) - math.lgamma(picks - j + 1)
        log_a = log_choose + (picks - j) * log_p + j * log_not_p  # P: the member's answers
        log_b = log_choose + j * log_p + (picks - j) * log_not_p  # Q: without the member
        lower[j] = log_b
        upper[j] = float(np.logaddexp(log_q + log_a, log_not_q + log_b))
    return upper, lower


def subsampled_pure_dp_pld(
    epsilon0: float, picks: int, q: float, value_discretization_interval: float
) -> pld_lib.PrivacyLossDistribution:
    """PLD (both directions, pessimistic connect-the-dots) of :func:`subsampled_pure_dp_pmfs`."""
    mixture, member_absent = subsampled_pure_dp_pmfs(epsilon0, picks, q)
    outcomes = sorted(mixture)
    log_mixture = np.array([mixture[j] for j in outcomes])
    log_absent = np.array([member_absent[j] for j in outcomes])
    remove = _connect_dots_pmf(log_mixture, log_absent, value_discretization_interval)
    add = _connect_dots_pmf(log_absent, log_mixture, value_discretization_interval)
    return pld_lib.PrivacyLossDistribution(remove, add)


def randomized_response_pld(epsilon: float, value_discretization_interval: float) -> pld_lib.PrivacyLossDistribution:
    """PLD (pessimistic connect-the-dots) of the randomized-response pair of ``epsilon``, which
    dominates every epsilon-DP mechanism (Kairouz, Oh and Viswanath 2015, Thm 2.1); symmetric."""
    log_keep = -float(np.logaddexp(0.0, -epsilon))
    log_flip = -float(np.logaddexp(0.0, epsilon))
    pmf = _connect_dots_pmf(
        np.array([log_keep, log_flip]), np.array([log_flip, log_keep]), value_discretization_interval
    )
    return pld_lib.PrivacyLossDistribution(pmf)


def _connect_dots_pmf(log_upper: np.ndarray, log_lower: np.ndarray, interval: float) -> pld_pmf.PLDPmf:
    """The privacy loss log(upper / lower) under ``upper``, a pair on finitely many outcomes,
    discretized by pessimistic connect-the-dots (Doroshenko, Ghazi, Kamath, Kumar and
    Manurangsi 2022, Algorithm 1): the hockey-stick curve delta(e) = sum_j upper_j
    (1 - e^(e - loss_j))_+ is computed exactly at grid points bracketing every loss, and
    the PLD on those points whose curve interpolates them (linearly in e^e) dominates the
    pair. Rounding each loss up instead adds up to one grid step per composition (T steps
    after T generations); this is never worse and in practice far better (measured against
    exact values, tests/privacy/test_pure_plan_exact.py). Between two brackets the exact curve
    is itself linear in e^e, so the points the dense grid would add get no mass: the
    floor and ceiling of each loss suffice.
    """
    upper = np.exp(log_upper)
    loss = log_upper - log_lower
    keep = upper > 0.0  # outcomes the upper side never produces carry no loss mass
    upper, loss = upper[keep], loss[keep]
    if not np.all(np.isfinite(loss)):
        raise ValueError("connect-the-dots: every outcome of the upper side must be possible on the lower side")
    scaled = loss / interval
    below, above = np.floor(scaled), np.ceil(scaled)
    below = np.where(below * interval > loss, below - 1.0, below)  # float rounding: keep each loss bracketed
    above = np.where(above * interval < loss, above + 1.0, above)
    points = np.unique(np.concatenate([below, above])).astype(np.int64)
    grid = points * interval
    deltas = np.maximum(0.0, -np.expm1(grid[:, None] - loss[None, :])) @ upper
    return pld_pmf.create_pmf_pessimistic_connect_dots(interval, points, np.minimum(deltas, 1.0))


class ExtendedPldAccountant(_DpaPldAccountant):
    """dp-accounting's PLD accountant that also reads PureDp / GumbelTopK (also Poisson-sampled).

    A pure eps'-DP part becomes the randomized-response PLD of eps' (it dominates every
    eps'-DP mechanism), self-composed ``count`` times.
    A Poisson-sampled part made of m equal eps0-DP steps gets the PLD of its tight
    dominating pair (:func:`subsampled_pure_dp_pmfs`), not the looser RR(ln(1 + q(e^(m eps0) - 1))).
    Both are discretized by connect-the-dots (:func:`_connect_dots_pmf`), not by rounding losses up.
    """

    _pld: pld_lib.PrivacyLossDistribution  # the base class's running composition

    def __init__(self, value_discretization_interval: float) -> None:
        super().__init__(neighboring_relation=NEIGHBOURS, value_discretization_interval=value_discretization_interval)

    def _compose_pure(self, epsilon: float, count: int) -> None:
        if epsilon == 0.0:
            return
        if epsilon > HUGE_EPSILON:  # e^eps overflows in dp-accounting; inf is still a valid bound
            self._contains_non_dp_event = True
            return
        single = randomized_response_pld(epsilon, self._value_discretization_interval)
        self._pld = self._pld.compose(single.self_compose(count) if count > 1 else single)

    def _maybe_compose(
        self, event: dpe.DpEvent, count: int, do_compose: bool
    ) -> dp_accounting.PrivacyAccountant.CompositionErrorDetails | None:
        if isinstance(event, dpe.PoissonSampledDpEvent) and float(event.sampling_probability) >= 1 - _Q_READ_AS_ONE:
            # Sampling every record is the worst case of Poisson sampling, so this is a valid
            # upper bound; with q this close to 1 the two differ by a negligible amount.
            return self._maybe_compose(event.event, count, do_compose)
        if isinstance(event, PureDpEvent):
            if do_compose:
                self._compose_pure(float(event.epsilon), count)
            return None
        if isinstance(event, GumbelTopKDpEvent):
            # one-shot top-k = k adaptive eps0-DP picks (peeling): k eps0-DP PLDs composed,
            # which is never looser than one (k eps0)-DP PLD
            if do_compose:
                self._compose_pure(float(event.epsilon0), count * int(event.k))
            return None
        if isinstance(event, dpe.PoissonSampledDpEvent) and not _supported_by_dp_accounting(
            super()._maybe_compose, event
        ):
            picks = pure_picks(event.event)
            q = float(event.sampling_probability)
            if picks is not None and q > 0.0 and len(set(picks)) == 1 and 0.0 < picks[0] < math.inf:
                if do_compose:
                    single = subsampled_pure_dp_pld(picks[0], len(picks), q, self._value_discretization_interval)
                    self._pld = self._pld.compose(single.self_compose(count) if count > 1 else single)
                return None
            amplified = pure_epsilon_of(event)  # mixed steps: RR of the amplified total (valid, looser)
            if amplified is not None:
                if do_compose:
                    self._compose_pure(amplified, count)
                return None
            z_eff = effective_noise_multiplier_of(event.event)
            if z_eff is None:
                return CompositionError(event, "Poisson-sampled subevent must be Gaussian(s) or pure DP")
            if math.isinf(z_eff):
                return None
            single = dpe.PoissonSampledDpEvent(event.sampling_probability, dpe.GaussianDpEvent(z_eff))
            return super()._maybe_compose(single, count, do_compose)
        return super()._maybe_compose(event, count, do_compose)


def _supported_by_dp_accounting(parent_maybe_compose: Callable[..., Any], event: dpe.DpEvent) -> bool:
    if contains_own_event(event):
        return False
    return parent_maybe_compose(event, 0, False) is None


# --------------------------------------------------------------------------- accountants


class _DropConvergenceWarnings(logging.Filter):
    """dp-accounting logs, for each fractional RDP order whose series does not converge,
    that it excludes that order. Excluding an order keeps the bound valid, so the
    message is noise to users; everything else from absl still gets through."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "failed to converge" not in record.getMessage()


class quiet_absl_convergence:
    _filter = _DropConvergenceWarnings()

    def __enter__(self) -> None:
        logging.getLogger("absl").addFilter(self._filter)

    def __exit__(self, *exc: object) -> None:
        logging.getLogger("absl").removeFilter(self._filter)
