"""Secure aggregation: the coordinator learns only the sum of the silos' noised values.

Under the ``distributed`` placement each silo adds N(0, sigma^2 / S); only the *sum* of
the S replies carries the run's sigma. With ``secure_aggregation`` on, the replies are
summed by Flower's SecAgg+ protocol (``SecAggPlusWorkflow`` at the coordinator,
``secaggplus_mod`` at each silo): every silo masks its quantized vector with pairwise
and private masks that cancel only in the sum, so a coordinator that follows the
protocol sees nothing but the sum (unmasking one silo takes key shares from half of them).
The DP guarantee against the coordinator assumes it colludes with no silo: colluders can
subtract their own noise shares (docs/federated.md).

SecAgg+ sums fixed-point values: each silo clips every entry to ``[-bound, bound]`` and
rounds it stochastically to ``2^22`` levels; the masks live modulo ``2^32``. Both steps
run on values that are already noised, so they are post-processing (no privacy cost).
The bound is public (from the declared silo sizes, the clip bound and the noise std),
wide enough that a clipped entry needs a 12-sigma noise draw; the rounding error of the
sum (about ``bound / 2^22`` per silo) is far below the noise.

A sum is used only if every silo contributed: SecAgg+ can unmask the sum of the silos
that stayed, but that sum carries less than sigma^2 of noise, so the coordinator refuses
it (the charge stands, nothing is released from that step).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

QUANTIZATION_LEVELS = 2**22
MODULUS = 2**32
# Every silo's quantized entry is below 2^22 and its weight factor is 2^22: the sum of S of them
# must stay below the 2^32 modulus.
MAX_SILOS = MODULUS // QUANTIZATION_LEVELS - 1
RECONSTRUCTION_FRACTION = 0.5  # shares needed to unmask a silo that drops out, as a fraction of S


def check_secure_aggregation(enabled: bool, placement: str, silos: int, jse: str, control_variate: bool) -> None:
    """Refuse, before any charge, what secure aggregation cannot do (naming the setting)."""
    if not enabled:
        return
    if placement != "distributed":
        raise ValueError("secure_aggregation: only placement 'distributed' needs it (under 'local' each silo's "
                         "value already carries the full noise; under 'central' the coordinator adds the noise "
                         f"to raw sums); got placement {placement!r}")
    if jse == "coordinator" or control_variate:
        raise ValueError("secure_aggregation: the coordinator sees only the sum, so it cannot shrink or correct "
                         "each silo's estimate; use jse 'none' or 'silo' and control_variate false")
    if not 2 <= silos <= MAX_SILOS:
        raise ValueError(f"secure_aggregation: Flower's SecAgg+ needs 2 to {MAX_SILOS} silos (it sums 22-bit "
                         f"values modulo 2^32); got {silos}")


def value_bound(silo_sizes: Sequence[int], clip_bound: float, noise_std: float) -> float:
    """A public bound on any entry a silo sends: its clipped sums and counts (at most
    ``max(1, C)`` per record) over its declared size, plus 12 standard deviations of its noise."""
    return float(max(silo_sizes)) * max(1.0, float(clip_bound)) + 12.0 * float(noise_std)


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


def flower_secure_sum(grid: Any, node_ids: Sequence[int], request: dict[str, Any], bound: float,
                      round_number: int, timeout: float | None = None) -> np.ndarray:
    """Run one SecAgg+ round over ``node_ids``; return the sum of the silos' replies (one array)."""
    from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict
    from flwr.server.compat.legacy_context import LegacyContext
    from flwr.server.workflow import SecAggPlusWorkflow
    from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
    from flwr.server.workflow.constant import Key as WorkflowKey

    silos = len(node_ids)
    strategy = _strategy(request, node_ids)
    state = RecordDict({MAIN_CONFIGS_RECORD: ConfigRecord({WorkflowKey.CURRENT_ROUND: int(round_number)}),
                        MAIN_PARAMS_RECORD: ArrayRecord()})
    context = LegacyContext(Context(run_id=0, node_id=0, node_config={}, state=state, run_config={}),
                            strategy=strategy)
    # Every silo holds a share of every other's keys; max_weight 1 with weight 1 per silo makes the
    # unmasked result the plain mean of the clipped, quantized values.
    workflow = SecAggPlusWorkflow(num_shares=1.0, reconstruction_threshold=RECONSTRUCTION_FRACTION, max_weight=1.0,
                                  clipping_range=float(bound), quantization_range=QUANTIZATION_LEVELS,
                                  modulus_range=MODULUS, timeout=timeout)
    workflow(grid, context)
    if strategy.mean is None or strategy.contributors != silos:
        raise RuntimeError(f"secure aggregation: {strategy.contributors} of {silos} silos contributed; a partial "
                           "sum carries less noise than the run charged, so it is not used")
    return np.asarray(strategy.mean[0], dtype=float) * silos


__all__ = ["MAX_SILOS", "check_secure_aggregation", "flower_secure_sum", "value_bound"]
