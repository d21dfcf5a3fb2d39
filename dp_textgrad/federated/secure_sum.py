"""Secure aggregation: the coordinator learns only sums of the silos' noised values.

Under the ``distributed`` placement with ``secure_aggregation`` the replies are summed by
Flower's SecAgg+ protocol (``SecAggPlusWorkflow`` at the coordinator, ``secaggplus_mod`` at
each silo): every silo masks its quantized vector with pairwise and private masks that
cancel only in the sum, so a coordinator that follows the protocol sees nothing but a sum.
The DP guarantee against the coordinator assumes it colludes with no silo: colluders can
subtract their own noise shares (docs/federated.md).

Dropouts. When silos drop out, SecAgg+ unmasks the sum of those that stayed, as long as at
least t = :func:`unmask_threshold` did (the reconstruction threshold, passed to Flower as
that integer). So every sum the coordinator can see has at least t silos, and each silo
adds N(0, sigma^2 / t): any such sum carries at least the run's sigma^2, and the full sum
of S silos carries sigma^2 S / t (the accuracy cost of surviving dropouts). The run still
uses a sum only when every silo contributed (a partial sum would be a different estimate);
the charge of a failed step stands.

Fixed point. SecAgg+ sums integers: each silo's value is clipped to ``[-B, B]`` and
stochastically rounded to a grid of step 2B / 2^22; the masks live modulo 2^32. Both act on
each silo's share, which carries only sigma^2 / t, so they are *not* post-processing of the
sum. They are accounted instead (docs/federated.md, "Clipping and rounding"):

- the silo clips its *un-noised* values to ``[-(B - 12 s), B - 12 s]`` before adding its
  noise of std s (1-Lipschitz per entry: the sensitivity does not grow), so the protocol's
  clipping changes a share only on a 12-sigma noise draw;
- :func:`coupling_error` bounds the total variation between the released sum and a
  post-processing of the Gaussian sum (no clipping, rounding of the sum alone); the
  guarantee against the coordinator adds (1 + e^eps) times it to delta.

B is public (from the declared silo sizes, the clip bound and the noise std).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

QUANTIZATION_LEVELS = 2**22
MODULUS = 2**32
# Every silo's quantized entry is below 2^22 and its weight factor is 2^22: the sum of S of them
# must stay below the 2^32 modulus.
MAX_SILOS = MODULUS // QUANTIZATION_LEVELS - 1
RECONSTRUCTION_FRACTION = 0.5  # shares needed to unmask a silo that drops out, as a fraction of S
CLIP_SIGMAS = 12.0  # the value bound leaves this many noise stds above a silo's clipped un-noised value
# Refuse a secure sum whose fixed point could move the delta of the guarantee by more than this
# (it is then charged to delta, see coupling_error; at the default sizes it is below 1e-30).
MAX_COUPLING_ERROR = 1e-12


def unmask_threshold(silos: int) -> int:
    """t: the fewest silos whose sum SecAgg+ unmasks (its reconstruction threshold, at least 2)."""
    if isinstance(silos, bool) or not isinstance(silos, int) or silos < 1:
        raise ValueError(f"silos: need at least one silo, got {silos!r}")
    return min(silos, max(2, math.ceil(RECONSTRUCTION_FRACTION * silos)))


def grid_step(bound: float) -> float:
    """The step of SecAgg+'s fixed-point grid for values in [-bound, bound]."""
    return 2.0 * float(bound) / QUANTIZATION_LEVELS


def coupling_error(entries: int, silos: int, silo_std: float, bound: float) -> float:
    """An upper bound on the total variation between one secure sum of ``entries`` values and a
    post-processing of the Gaussian sum, for any data (docs/federated.md, "Clipping and rounding").

    Clipping: a share's entry is clipped only if its noise exceeds CLIP_SIGMAS stds (the silo clipped
    its un-noised value to B - CLIP_SIGMAS s): probability erfc(CLIP_SIGMAS / sqrt 2) per silo and entry.
    Rounding (grid step D, s' = s / D): the characteristic function of a stochastically rounded
    share differs from its lattice-aliased ideal by a = 2 sum_{j>=1} exp(-2 pi^2 s'^2 (j - 1/2)^2);
    the sum of S shares then differs pointwise by at most e_F = (1 + a)^S - 1 in probability, so by
    at most (2M + 1) e_F / 2 + erfc(40 / sqrt 2) in total variation on the window
    |k - V| <= M = S + 40 s' sqrt(S) grid points (outside it both laws have Gaussian tails).
    Entries are independent given the data: the bounds add up."""
    if entries < 0 or silos < 1 or silo_std < 0 or bound <= 0:
        raise ValueError("coupling_error: entries >= 0, silos >= 1, silo_std >= 0 and bound > 0")
    if entries == 0:
        return 0.0
    scaled = float(silo_std) / grid_step(bound)
    if scaled < 1.0:
        return 1.0  # no useful bound: the grid is as coarse as the noise
    clip = silos * math.erfc(CLIP_SIGMAS / math.sqrt(2.0))
    aliasing = 2.0 * sum(math.exp(-2.0 * math.pi**2 * scaled**2 * (j - 0.5) ** 2) for j in range(1, 6))
    pointwise = math.expm1(silos * math.log1p(aliasing))
    window = silos + 40.0 * scaled * math.sqrt(silos)
    rounding = 0.5 * (2.0 * window + 1.0) * pointwise + math.erfc(40.0 / math.sqrt(2.0))
    return min(1.0, float(entries) * (clip + rounding))


def check_secure_aggregation(enabled: bool, placement: str, silos: int, jse: str, control_variate: bool) -> None:
    """Refuse, before any charge, what secure aggregation cannot do (naming the setting)."""
    if not enabled:
        return
    if placement != "distributed":
        raise ValueError(
            "secure_aggregation: only placement 'distributed' needs it (under 'local' each silo's "
            "value already carries the full noise; under 'central' the coordinator adds the noise "
            f"to raw sums); got placement {placement!r}"
        )
    if jse != "none" or control_variate:
        raise ValueError(
            "secure_aggregation: the coordinator sees only the sum, and a silo's own shrinkage would "
            "release more than the sum; use jse 'none' and control_variate false"
        )
    if not 2 <= silos <= MAX_SILOS:
        raise ValueError(
            f"secure_aggregation: Flower's SecAgg+ needs 2 to {MAX_SILOS} silos (it sums 22-bit "
            f"values modulo 2^32); got {silos}"
        )


def value_bound(silo_sizes: Sequence[int], clip_bound: float, noise_std: float) -> float:
    """A public bound on any entry a silo sends: its clipped sums and counts (at most
    ``max(1, C)`` per record) over its public size, plus 12 standard deviations of its noise.
    A silo clips its un-noised values to ``bound - 12 noise_std`` (:func:`clip_before_noise`)."""
    return float(max(silo_sizes)) * max(1.0, float(clip_bound)) + CLIP_SIGMAS * float(noise_std)


def clip_before_noise(values: np.ndarray, bound: float, noise_std: float) -> np.ndarray:
    """A silo's un-noised values clipped to ``[-(bound - 12 noise_std), bound - 12 noise_std]``: an
    entry-wise 1-Lipschitz map, so the sum's sensitivity (and the charged event) is unchanged."""
    room = float(bound) - CLIP_SIGMAS * float(noise_std)
    if not math.isfinite(room) or room <= 0:
        raise ValueError(f"value_bound: {bound:g} leaves no room above {CLIP_SIGMAS:g} noise stds ({noise_std:g} each)")
    return np.clip(np.asarray(values, dtype=float), -room, room)


class _Node:
    """What the SecAgg+ workflow needs of a legacy client proxy: its node id."""

    def __init__(self, node_id: int) -> None:
        self.node_id = node_id


def _strategy(request: dict[str, Any], node_ids: Sequence[int]) -> Any:
    """A Flower strategy for one secure sum: the same request to every silo, the unmasked mean kept."""
    from flwr.common import FitIns, Parameters, parameters_to_ndarrays
    from flwr.server.strategy import Strategy

    class SecureSumStrategy(Strategy):
        def __init__(self) -> None:
            self.mean: list[np.ndarray] | None = None
            self.contributors = 0

        def initialize_parameters(self, client_manager: Any) -> Any:
            return None

        def configure_fit(self, server_round: int, parameters: Any, client_manager: Any) -> Any:
            ins = FitIns(Parameters(tensors=[], tensor_type="numpy.ndarray"), {"request": json.dumps(request)})
            return [(_Node(n), ins) for n in node_ids]

        def aggregate_fit(self, server_round: int, results: Any, failures: Any) -> Any:
            self.contributors = len(results)
            if results:
                self.mean = parameters_to_ndarrays(results[0][1].parameters)
            return None, {}

        def configure_evaluate(self, server_round: int, parameters: Any, client_manager: Any) -> Any:
            return []

        def aggregate_evaluate(self, server_round: int, results: Any, failures: Any) -> Any:
            return None, {}

        def evaluate(self, server_round: int, parameters: Any) -> Any:
            return None

    return SecureSumStrategy()


def flower_secure_sum(
    grid: Any,
    node_ids: Sequence[int],
    request: dict[str, Any],
    bound: float,
    round_number: int,
    timeout: float | None = None,
) -> np.ndarray:
    """Run one SecAgg+ round over ``node_ids``; return the sum of the silos' replies (one array)."""
    from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict
    from flwr.server.compat.legacy_context import LegacyContext
    from flwr.server.workflow import SecAggPlusWorkflow
    from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
    from flwr.server.workflow.constant import Key as WorkflowKey

    silos = len(node_ids)
    strategy = _strategy(request, node_ids)
    state = RecordDict(
        {
            MAIN_CONFIGS_RECORD: ConfigRecord({WorkflowKey.CURRENT_ROUND: int(round_number)}),
            MAIN_PARAMS_RECORD: ArrayRecord(),
        }
    )
    context = LegacyContext(Context(run_id=0, node_id=0, node_config={}, state=state, run_config={}), strategy=strategy)
    # Every silo holds a share of every other's keys; max_weight 1 with weight 1 per silo makes the
    # unmasked result the plain mean of the clipped, quantized values. The threshold is passed as
    # the integer t each silo's noise share is calibrated to (Flower would round a fraction itself).
    workflow = SecAggPlusWorkflow(
        num_shares=1.0,
        reconstruction_threshold=unmask_threshold(silos),
        max_weight=1.0,
        clipping_range=float(bound),
        quantization_range=QUANTIZATION_LEVELS,
        modulus_range=MODULUS,
        timeout=timeout,
    )
    workflow(grid, context)
    if strategy.mean is None or strategy.contributors != silos:
        raise RuntimeError(
            f"secure aggregation: {strategy.contributors} of {silos} silos contributed; a partial "
            "sum carries less noise than the run charged, so it is not used"
        )
    return np.asarray(strategy.mean[0], dtype=float) * silos


__all__ = [
    "CLIP_SIGMAS",
    "MAX_COUPLING_ERROR",
    "MAX_SILOS",
    "check_secure_aggregation",
    "clip_before_noise",
    "coupling_error",
    "flower_secure_sum",
    "grid_step",
    "unmask_threshold",
    "value_bound",
]
