"""The coordinator's scoring backend: asks every silo, combines what the placement lets it see.

:class:`FederatedScoring` plugs into the DP-ES scorer through the scoring-backend seam
(:mod:`dp_textgrad.dp_es.scoring_backends`), so a federated run charges exactly the events of a
single-machine run at the same noise multiplier:

- ``central``: it asks for un-noised totals and adds them up; the scorer adds the noise
  once (a trusted coordinator, like the Ray backend).
- ``distributed`` / ``local``: it is a ``NoisingBackend``: every silo adds its own share
  of the noise, and the coordinator only ever holds noised values. Under ``local`` it may
  then post-process them: remove each silo's drift (control variate) and shrink each silo
  toward the pooled estimate (coordinator James-Stein), before summing. Under
  ``distributed`` a silo's value carries only a share of the noise, so the released total
  must be the plain sum: both options are refused there.
- ``distributed`` with ``secure_aggregation``: the transport returns only the sum of the
  silos' noised values (Flower's SecAgg+, :mod:`dp_textgrad.federated.secure_sum`); each
  silo's share is calibrated to the reconstruction threshold t, and the coordinator adds up
  the coupling error of the fixed-point sums (the guarantee's delta term).

A transport carries the requests: :class:`InProcessSilos` (tests, benchmarks) or the
Flower grid (:mod:`dp_textgrad.federated.flower_app`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

from dp_textgrad import runs
from dp_textgrad.dp_es.scoring_backends import NoisedRelease, SubsampleTotals
from dp_textgrad.federated.placement import NoisePlacement, check_estimators, check_placement, silo_mechanism
from dp_textgrad.federated.secure_sum import (
    MAX_COUPLING_ERROR,
    check_secure_aggregation,
    coupling_error,
    unmask_threshold,
    value_bound,
)
from dp_textgrad.federated.shrinkage import remove_drift, shrink_toward_pooled
from dp_textgrad.federated.silo import Silo, SiloState

Shrinkage = Literal["none", "coordinator", "silo"]
SHRINKAGE: tuple[Shrinkage, ...] = ("none", "coordinator", "silo")


class SiloTransport(Protocol):
    """Sends one request to each silo (in silo order) and returns their replies in that order."""

    def ask(self, requests: Sequence[dict[str, Any]]) -> list[dict[str, Any]]: ...

    def ask_sum(self, request: dict[str, Any], key: str, bound: float) -> np.ndarray:
        """The same request to every silo; only the sum of ``reply[key]`` (entries clipped to
        ``[-bound, bound]``) comes back."""
        ...


class InProcessSilos:
    """Silos in this process: the same requests and replies as over Flower, without the network."""

    def __init__(self, silos: Sequence[Silo], keep_replies: bool = False) -> None:
        self.silos = list(silos)
        self.states = [SiloState() for _ in self.silos]
        # Every reply, only when asked (tests of what the coordinator receives).
        self.seen: list[list[dict[str, Any]]] | None = [] if keep_replies else None

    def ask(self, requests: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        replies = [silo.handle(request, state) for silo, state, request in zip(self.silos, self.states, requests)]
        if self.seen is not None:
            self.seen.append(replies)
        return replies

    def ask_sum(self, request: dict[str, Any], key: str, bound: float) -> np.ndarray:
        # The arithmetic of a secure sum without its cryptography (nor its rounding): the same clipping,
        # one total.
        replies = [silo.handle(dict(request), state) for silo, state in zip(self.silos, self.states)]
        total = sum(np.clip(np.asarray(r[key], dtype=float), -bound, bound) for r in replies)
        if self.seen is not None:
            self.seen.append([{key: total}])
        return np.asarray(total)


def check_shrinkage(shrinkage: str, placement: NoisePlacement, control_variate: bool) -> Shrinkage:
    if shrinkage not in SHRINKAGE:
        raise ValueError(f"jse: use one of {', '.join(SHRINKAGE)}, got {shrinkage!r}")
    if placement == "central" and (shrinkage != "none" or control_variate):
        raise ValueError(
            "jse: under placement 'central' the coordinator sees only the noised total, so "
            "there are no per-silo estimates to shrink or correct; use jse='none' and "
            "control_variate=false, or a 'distributed'/'local' placement"
        )
    check_estimators(placement, shrinkage, control_variate)
    return shrinkage


class FederatedScoring:
    """A scoring backend over S silos with public sizes ``silo_sizes``."""

    def __init__(
        self,
        transport: SiloTransport,
        silo_sizes: Sequence[int],
        placement: NoisePlacement,
        shrinkage: Shrinkage = "none",
        control_variate: bool = False,
        secure_aggregation: bool = False,
        coupling_path: Any = None,
        num_labels: int | None = None,
    ) -> None:
        self.transport = transport
        self.silo_sizes = [int(n) for n in silo_sizes]
        self.placement = check_placement(placement, len(self.silo_sizes))
        self.shrinkage = check_shrinkage(shrinkage, self.placement, control_variate)
        self.control_variate = bool(control_variate)
        check_secure_aggregation(secure_aggregation, self.placement, self.silos, self.shrinkage, self.control_variate)
        self.secure_aggregation = bool(secure_aggregation)
        # t: the fewest silos whose sum the coordinator can see (each silo adds sigma^2 / t).
        self.unmask_threshold = unmask_threshold(self.silos) if self.secure_aggregation else None
        # Total variation of the fixed-point sums so far (a delta term); kept in ``coupling_path``
        # (written before each sum, so a resumed run continues it).
        self.coupling_path = coupling_path
        self.num_labels = num_labels  # the task's public label count (sizes a confusion sum before it is asked)
        self.coupling_error = 0.0
        if coupling_path is not None and Path(coupling_path).is_file():
            self.coupling_error = float(json.loads(Path(coupling_path).read_text(encoding="utf-8"))["coupling_error"])
        self.num_candidates = 0

    @property
    def adds_noise(self) -> bool:
        return self.placement != "central"

    @property
    def silos(self) -> int:
        return len(self.silo_sizes)

    def totals(
        self, prompts: Sequence[str], sampling_rate: float, clip_bound: float, with_confusion: bool
    ) -> SubsampleTotals:
        if self.adds_noise:
            raise PermissionError(f"placement: under '{self.placement}' the silos never send un-noised totals")
        request = {
            "kind": "totals",
            "prompts": [str(p) for p in prompts],
            "sampling_rate": float(sampling_rate),
            "clip_bound": float(clip_bound),
            "with_confusion": bool(with_confusion),
        }
        replies = self.transport.ask([dict(request) for _ in range(self.silos)])
        parts = [
            SubsampleTotals(
                np.asarray(r["sums"], dtype=float),
                None if r.get("confusion") is None else np.asarray(r["confusion"], dtype=float),
            )
            for r in replies
        ]
        total = parts[0]
        for part in parts[1:]:
            total = total + part
        return total

    def noised_sums(
        self, prompts: Sequence[str], sampling_rate: float, mechanism: Any, keep_confusion: bool
    ) -> NoisedRelease:
        prompts = [str(p) for p in prompts]
        self.num_candidates = len(prompts)
        request = {
            "kind": "noised_sums",
            "prompts": prompts,
            "sampling_rate": float(sampling_rate),
            "clip_bound": float(mechanism.clip_bound),
            "noise_multiplier": float(mechanism.noise_multiplier),
            "feedback_noise_multiplier": mechanism.feedback_noise_multiplier,
            "keep_confusion": bool(keep_confusion),
        }
        silo_std = silo_mechanism(mechanism, self.placement, self.silos, self.unmask_threshold).noise_std
        if self.secure_aggregation:
            return self._secure_sum(request, "sums", mechanism.clip_bound, silo_std)
        replies = self.transport.ask([dict(request) for _ in range(self.silos)])
        sums = np.stack([np.asarray(r["sums"], dtype=float) for r in replies])
        sums = self._post_process(sums, silo_std, float(sampling_rate))
        return NoisedRelease(sums.sum(axis=0), silo_std * math.sqrt(self.silos))

    def noised_confusion(self, indices: Sequence[int], mechanism: Any) -> NoisedRelease:
        request = {
            "kind": "noised_confusion",
            "indices": [int(i) for i in indices],
            "num_candidates": self.num_candidates,
            "clip_bound": float(mechanism.clip_bound),
            "noise_multiplier": float(mechanism.noise_multiplier),
            "feedback_noise_multiplier": mechanism.feedback_noise_multiplier,
        }
        silo_std = silo_mechanism(mechanism, self.placement, self.silos, self.unmask_threshold).confusion_noise_std(
            len(indices)
        )
        if self.secure_aggregation:
            return self._secure_sum(request, "confusion", mechanism.clip_bound, silo_std)
        replies = self.transport.ask([dict(request) for _ in range(self.silos)])
        total = sum(np.asarray(r["confusion"], dtype=float) for r in replies)
        return NoisedRelease(np.asarray(total), silo_std * math.sqrt(self.silos))

    def _secure_sum(self, request: dict[str, Any], key: str, clip_bound: float, silo_std: float) -> NoisedRelease:
        """Only the silos' total of ``reply[key]`` reaches the coordinator (public clipping bound, which
        each silo also applies to its un-noised values)."""
        bound = value_bound(self.silo_sizes, clip_bound, silo_std)
        per_entry = coupling_error(1, self.silos, silo_std, bound)
        if per_entry > MAX_COUPLING_ERROR:  # checked before anything is sent
            raise ValueError(
                f"secure_aggregation: SecAgg+'s 22-bit fixed point over values up to {bound:g} is too "
                f"coarse for the silos' noise std {silo_std:g} (coupling error {per_entry:.1e} per "
                "value); declare smaller silo sizes, use more noise, or secure_aggregation false"
            )
        # Counted before the sum is asked for, from its size (K sums, or m L^2 counts; unknown L: after).
        entries = (
            len(request["prompts"])
            if key == "sums"
            else None
            if self.num_labels is None
            else len(request["indices"]) * int(self.num_labels) ** 2
        )
        self._count_coupling(per_entry * (entries or 0))
        total = np.asarray(self.transport.ask_sum({**request, "value_bound": bound}, key, bound))
        if entries is None:
            self._count_coupling(per_entry * int(total.size))
        elif total.size > entries:
            raise RuntimeError("secure aggregation: the sum has more values than requested")
        return NoisedRelease(total, silo_std * math.sqrt(self.silos))

    def _count_coupling(self, error: float) -> None:
        self.coupling_error += error
        if self.coupling_path is not None:
            runs.write_json(self.coupling_path, {"coupling_error": self.coupling_error})  # public file time

    def _post_process(self, sums: np.ndarray, silo_std: float, sampling_rate: float) -> np.ndarray:
        """Drift removal and coordinator shrinkage, in per-record estimate scale (public q * n_s)."""
        if not self.control_variate and self.shrinkage != "coordinator":
            return sums
        scale = sampling_rate * np.asarray(self.silo_sizes, dtype=float)
        estimates = sums / scale[:, None]
        if self.control_variate:
            estimates = remove_drift(estimates, self.silo_sizes)
        if self.shrinkage == "coordinator":
            estimates = shrink_toward_pooled(estimates, silo_std / scale, self.silo_sizes)
        return estimates * scale[:, None]


__all__ = ["FederatedScoring", "InProcessSilos", "SHRINKAGE", "Shrinkage", "SiloTransport", "check_shrinkage"]
