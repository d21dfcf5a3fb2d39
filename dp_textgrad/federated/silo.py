"""One silo: its own private records, engine and noise; it answers the coordinator's requests.

A request names prompts and public parameters; the reply holds only what the silo's
noise placement allows to leave it:

- ``totals`` (placement ``central`` only): per-candidate sums of clipped scores and,
  when asked, confusion counts, un-noised (the coordinator is trusted and adds the noise);
- ``noised_sums`` (``distributed``, ``local``): the sums with the silo's own share of the
  noise (and, if configured, James-Stein shrinkage across candidates, post-processing);
  the confusion counts of that subsample stay in the silo's state for the next request;
- ``noised_confusion``: the noised confusion matrices of the candidates the coordinator
  chose from released scores, on the same subsample; the counts are then dropped.

The silo keeps its own account: under ``local`` and ``distributed`` it computes its
noise share itself from the run's noise multiplier (a coordinator cannot ask it for
less), records the event its own noise gives its records, and refuses a request that
would take its records past its own ``max_epsilon``. With an ``account_path`` the account
is a file the silo rewrites atomically (under a file lock) before each read of its
records: it outlives a run that is killed and resumed and, in a directory kept across
runs, composes every run that silo answered (``max_epsilon`` then caps its lifetime).
Nothing a silo logs or returns is computed from its records except through its noise.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dp_textgrad._io import atomic_write_json
from dp_textgrad.dp_es.preflight import length_tools
from dp_textgrad.dp_es.scoring import batch_totals
from dp_textgrad.federated.placement import NoisePlacement, check_placement, silo_mechanism
from dp_textgrad.federated.shrinkage import shrink_within
from dp_textgrad.privacy.accounting.bounds import smallest_bound
from dp_textgrad.privacy.accounting.serialize import event_from_dict, event_to_dict
from dp_textgrad.privacy.mechanisms import GaussianScoreMechanism
from dp_textgrad.privacy.noise import NoiseSource

REQUEST_KINDS = ("totals", "noised_sums", "noised_confusion")


class SiloRefused(RuntimeError):
    """The silo would not answer: its own budget, or a request its placement forbids."""


@dataclass
class SiloState:
    """What a silo keeps between requests (on the silo only): events it answered, last counts."""

    events: list[dict[str, Any]] = field(default_factory=list)
    confusion: np.ndarray | None = None


@dataclass
class Silo:
    """A silo's records (a task whose ``private_train`` it alone holds), engine and placement."""

    name: str
    task: Any
    engine: Any
    placement: NoisePlacement
    silos: int
    noise: NoiseSource
    shrink: bool = False
    max_epsilon: float | None = None
    delta: float = 1e-5
    declared_size: int | None = None
    account_path: Path | None = None  # the silo's own account file (kept across a resumed run)

    def __post_init__(self) -> None:
        check_placement(self.placement, self.silos)
        if self.shrink and self.placement == "central":
            raise ValueError("jse: 'silo' shrinkage runs on noised values; under placement 'central' the "
                             "silos add no noise (use jse='coordinator' or 'none')")

    @classmethod
    def build(cls, name: str, task: Any, engine: Any, placement: NoisePlacement, silos: int, *,
              max_record_tokens: int, long_records: str = "truncate", insecure_seed: int | None = None,
              **options: Any) -> "Silo":
        """A silo whose records are cut to the public ``max_record_tokens`` cap (as the single machine does)."""
        bounded = task.with_bounded_records(*length_tools(engine), max_record_tokens, long_records)
        return cls(name, bounded, engine, placement, silos, NoiseSource(insecure_seed), **options)

    @property
    def size(self) -> int:
        """The silo's public size: declared by its owner, else its record count, then treated as public
        (like N on a single machine, docs/federated.md). Estimates divide by q times this."""
        return int(self.declared_size) if self.declared_size is not None else len(self.task.private_train)

    def handle(self, request: Mapping[str, Any], state: SiloState) -> dict[str, Any]:
        kind = request.get("kind")
        if kind not in REQUEST_KINDS:
            raise SiloRefused(f"kind: unknown request {kind!r}; expected one of {', '.join(REQUEST_KINDS)}")
        if kind == "totals":
            if self.placement != "central":
                raise SiloRefused(f"placement: this silo adds its own noise ('{self.placement}') and never "
                                  "sends un-noised totals")
            totals = self._totals(request, bool(request["with_confusion"]))
            return {"sums": totals.sums, "confusion": totals.confusion}
        if self.placement == "central":
            raise SiloRefused("placement: under 'central' the coordinator adds the noise; ask for totals")
        mechanism = silo_mechanism(_mechanism(request), self.placement, self.silos)
        if kind == "noised_confusion":
            return self._noised_confusion(request, mechanism, state)
        return self._noised_sums(request, mechanism, state)

    def answered(self, state: SiloState) -> list[dict[str, Any]]:
        """The events this silo's noise has answered: its account file when it keeps one, else this run's."""
        if self.account_path is not None and Path(self.account_path).is_file():
            return list(json.loads(Path(self.account_path).read_text(encoding="utf-8"))["events"])
        return list(state.events)

    def _account_lock(self) -> Any:
        if self.account_path is None:
            return contextlib.nullcontext()
        from filelock import FileLock

        Path(self.account_path).parent.mkdir(parents=True, exist_ok=True)
        return FileLock(f"{self.account_path}.lock")

    # -- internals ------------------------------------------------------------------
    def _totals(self, request: Mapping[str, Any], with_confusion: bool) -> Any:
        batch = self.task.private_train.poisson_subsample(float(request["sampling_rate"]),
                                                          self.noise.sampling_generator)
        return batch_totals(self.task, self.engine, list(request["prompts"]), batch,
                            float(request["clip_bound"]), with_confusion)

    def _noised_sums(self, request: Mapping[str, Any], mechanism: GaussianScoreMechanism,
                     state: SiloState) -> dict[str, Any]:
        event = mechanism.event(float(request["sampling_rate"]))
        with self._account_lock():  # runs sharing an account directory take turns
            answered = self.answered(state)
            if self.max_epsilon is not None:
                planned = [event_from_dict(e) for e in answered] + [event]
                if smallest_bound(planned, self.delta) > self.max_epsilon:
                    raise SiloRefused(f"max_epsilon: answering would take silo {self.name!r} past its own budget "
                                      f"of {self.max_epsilon:g} at delta {self.delta:g}")
            # Recorded before the records are read, as the ledger does.
            state.events = answered + [event_to_dict(event)]
            if self.account_path is not None:
                atomic_write_json(self.account_path, {"silo": self.name, "events": state.events})
        state.confusion = None
        totals = self._totals(request, bool(request["keep_confusion"]))
        noised = mechanism.release(totals.sums, self.noise)
        state.confusion = totals.confusion
        if self.shrink:  # post-processing in the silo's own estimate scale
            scale = float(request["sampling_rate"]) * self.size
            noised = shrink_within(noised / scale, mechanism.noise_std / scale) * scale
        return {"sums": noised, "noise_std": mechanism.noise_std}

    def _noised_confusion(self, request: Mapping[str, Any], mechanism: GaussianScoreMechanism,
                          state: SiloState) -> dict[str, Any]:
        if state.confusion is None:
            raise SiloRefused("noised_confusion: no confusion counts held; ask noised_sums with keep_confusion first")
        indices = [int(i) for i in request["indices"]]
        counts, state.confusion = state.confusion[indices], None  # released once, then dropped
        return {"confusion": mechanism.release_confusion(counts, self.noise),
                "noise_std": mechanism.confusion_noise_std(len(indices))}


def _mechanism(request: Mapping[str, Any]) -> GaussianScoreMechanism:
    feedback = request.get("feedback_noise_multiplier")
    return GaussianScoreMechanism(noise_multiplier=float(request["noise_multiplier"]),
                                  clip_bound=float(request["clip_bound"]),
                                  num_candidates=len(request["prompts"]) if "prompts" in request
                                  else int(request["num_candidates"]),
                                  feedback_noise_multiplier=None if feedback is None else float(feedback))


__all__ = ["REQUEST_KINDS", "Silo", "SiloRefused", "SiloState"]
