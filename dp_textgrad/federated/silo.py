"""One silo: its own private records, engine and noise; it answers the coordinator's requests.

A request names prompts and public parameters; the reply holds only what the silo's
noise placement allows to leave it:

- ``totals`` (placement ``central`` only): per-candidate sums of clipped scores and,
  when asked, confusion counts, un-noised (the coordinator is trusted and adds the noise);
- ``noised_sums`` (``distributed``, ``local``): the sums with the silo's own share of the
  noise (and, under ``local`` if configured, James-Stein shrinkage across candidates,
  post-processing); when the request charged feedback, the confusion counts of that
  subsample stay in the silo's state for the next request;
- ``size_count`` (any placement, when N is not declared): the silo's record count plus
  discrete Laplace noise at its own ``size_epsilon`` (never the request's), charged in its
  account before it counts (each request afresh);
- ``noised_confusion``: the noised confusion matrices of the candidates the coordinator
  chose from released scores, on the same subsample, at the feedback noise the silo charged
  with the sums (whatever this request asks); the counts are then dropped.

The silo keeps its own account: under ``local`` and ``distributed`` it computes its
noise share itself from the run's noise multiplier and its placement, records the event
its own noise gives its records before it reads them (the sums and the confusion counts of
one subsample are one Gaussian event), lists every release it sends, and refuses a request
that would take its records past its own ``max_epsilon`` (a tiny multiplier asked by a
deviating coordinator is refused, not answered). The cap is a privacy filter: it is checked
on the Renyi filter bound of the whole account (``filter_epsilon``, as a dataset's lifetime
store does), because the coordinator may choose each request after seeing earlier releases,
and the smallest of PLD and RDP holds only for requests fixed in advance. With an ``account_path`` the account
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

from dp_textgrad import runs
from dp_textgrad.dp_es.preflight import length_tools
from dp_textgrad.dp_es.scoring_backends import batch_totals
from dp_textgrad.federated.placement import NoisePlacement, check_placement, silo_mechanism
from dp_textgrad.federated.secure_sum import clip_before_noise
from dp_textgrad.federated.secure_sum import unmask_threshold as threshold_of
from dp_textgrad.federated.shrinkage import shrink_within
from dp_textgrad.privacy.accounting.filter import filter_epsilon
from dp_textgrad.privacy.accounting.serialize import event_from_dict, event_to_dict
from dp_textgrad.privacy.mechanisms import GaussianScoreMechanism, LaplaceCountMechanism
from dp_textgrad.privacy.noise import NoiseSource

REQUEST_KINDS = ("totals", "noised_sums", "noised_confusion", "size_count")


class SiloRefused(RuntimeError):
    """The silo would not answer: its own budget, or a request its placement forbids."""


@dataclass
class SiloState:
    """What a silo keeps between requests (on the silo only): events it answered, the releases it
    sent, the last confusion counts and the feedback noise multiplier it charged for them."""

    events: list[dict[str, Any]] = field(default_factory=list)
    confusion: np.ndarray | None = None
    feedback_noise_multiplier: float | None = None  # the silo's own share, charged with the sums
    releases: list[dict[str, Any]] = field(default_factory=list)


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
    secure_aggregation: bool = False  # distributed: sums are unmasked from t silos, so add sigma^2 / t
    size_epsilon: float | None = None  # epsilon of the DP count of its records (N not declared)

    def __post_init__(self) -> None:
        check_placement(self.placement, self.silos)
        if self.shrink and self.placement == "central":
            raise ValueError(
                "jse: 'silo' shrinkage runs on noised values; under placement 'central' the "
                "silos add no noise (use jse='coordinator' or 'none')"
            )
        if self.shrink and self.placement == "distributed":
            raise ValueError(
                "jse: 'silo' shrinkage under placement 'distributed' would release a function of "
                "this silo's value, which carries only a share of the noise; use jse 'none', or "
                "placement 'local'"
            )

    @property
    def unmask_threshold(self) -> int | None:
        """t, the fewest silos whose sum the coordinator can see (None: all S of them)."""
        return threshold_of(self.silos) if self.secure_aggregation and self.placement == "distributed" else None

    @classmethod
    def build(
        cls,
        name: str,
        task: Any,
        engine: Any,
        placement: NoisePlacement,
        silos: int,
        *,
        max_record_tokens: int,
        long_records: str = "truncate",
        insecure_seed: int | None = None,
        **options: Any,
    ) -> Silo:
        """A silo whose records are cut to the public ``max_record_tokens`` cap (as the single machine does)."""
        bounded = task.with_bounded_records(*length_tools(engine), max_record_tokens, long_records)
        return cls(name, bounded, engine, placement, silos, NoiseSource(insecure_seed), **options)

    @property
    def size(self) -> int:
        """The silo's public size: ``declared_size`` (declared by its owner, or the DP count it released;
        a federated run always sets it), else its record count, which then is treated as public (library
        and test use only). Estimates divide by q times this."""
        return int(self.declared_size) if self.declared_size is not None else len(self.task.private_train)

    def handle(self, request: Mapping[str, Any], state: SiloState) -> dict[str, Any]:
        kind = request.get("kind")
        if kind not in REQUEST_KINDS:
            raise SiloRefused(f"kind: unknown request {kind!r}; expected one of {', '.join(REQUEST_KINDS)}")
        if kind == "size_count":
            return self._size_count(state)
        if kind == "totals":
            if self.placement != "central":
                raise SiloRefused(
                    f"placement: this silo adds its own noise ('{self.placement}') and never sends un-noised totals"
                )
            totals = self._totals(request, bool(request["with_confusion"]))
            return {"sums": totals.sums, "confusion": totals.confusion}
        if self.placement == "central":
            raise SiloRefused("placement: under 'central' the coordinator adds the noise; ask for totals")
        if kind == "noised_confusion":
            return self._noised_confusion(request, state)
        mechanism = silo_mechanism(_mechanism(request), self.placement, self.silos, self.unmask_threshold)
        return self._noised_sums(request, mechanism, state)

    def answered(self, state: SiloState) -> list[dict[str, Any]]:
        """The events this silo's noise has answered: its account file when it keeps one, else this run's."""
        return self._account(state)["events"]

    def _account(self, state: SiloState) -> dict[str, list[dict[str, Any]]]:
        if self.account_path is not None and Path(self.account_path).is_file():
            saved = json.loads(Path(self.account_path).read_text(encoding="utf-8"))
            return {"events": list(saved["events"]), "releases": list(saved.get("releases", []))}
        return {"events": list(state.events), "releases": list(state.releases)}

    def _size_count(self, state: SiloState) -> dict[str, Any]:
        """The DP count of this silo's records at its own size_epsilon, charged before it counts (every
        request is charged and noised afresh: a run asks once and keeps the answer)."""
        if self.size_epsilon is None:
            raise SiloRefused("size_count: this silo has no size_epsilon (N or its size is declared)")
        mechanism = LaplaceCountMechanism(float(self.size_epsilon))
        with self._account_lock():
            account = self._account(state)
            if self.max_epsilon is not None and not self._within(
                [event_from_dict(e) for e in account["events"]] + [mechanism.event()]
            ):
                raise SiloRefused(
                    f"max_epsilon: counting would take silo {self.name!r} past its own budget of {self.max_epsilon:g} "
                    f"(the Renyi filter bound of its whole account at delta {self.delta:g})"
                )
            state.events = account["events"] + [event_to_dict(mechanism.event())]
            state.releases = account["releases"] + [
                {"kind": "size_count", "event": len(state.events) - 1, "noise_scale": mechanism.noise_scale}
            ]
            self._write_account(state)  # the charge first
        return {"size": mechanism.release(len(self.task.private_train), self.noise)}

    def _record_release(self, state: SiloState, release: dict[str, Any]) -> None:
        """List one release in the account (its kind, noise and the charged event that covers it)."""
        with self._account_lock():
            account = self._account(state)
            state.events, state.releases = account["events"], account["releases"] + [release]
            self._write_account(state)

    def _write_account(self, state: SiloState) -> None:
        if self.account_path is not None:
            runs.write_json(  # the public file time: a write's time would time the silo's scoring
                self.account_path, {"silo": self.name, "events": state.events, "releases": state.releases}
            )

    def _account_lock(self) -> Any:
        if self.account_path is None:
            return contextlib.nullcontext()
        from filelock import FileLock

        Path(self.account_path).parent.mkdir(parents=True, exist_ok=True)
        return FileLock(runs.silo_account_lock(self.account_path))

    # -- internals ------------------------------------------------------------------
    def _totals(self, request: Mapping[str, Any], with_confusion: bool) -> Any:
        batch = self.task.private_train.poisson_subsample(
            float(request["sampling_rate"]), self.noise.sampling_generator
        )
        return batch_totals(
            self.task, self.engine, list(request["prompts"]), batch, float(request["clip_bound"]), with_confusion
        )

    def _noised_sums(
        self, request: Mapping[str, Any], mechanism: GaussianScoreMechanism, state: SiloState
    ) -> dict[str, Any]:
        event = mechanism.event(float(request["sampling_rate"]))
        bound = request.get("value_bound")
        if bound is not None:  # a secure sum: the un-noised values are clipped below it (checked first)
            clip_before_noise(np.zeros(1), float(bound), mechanism.noise_std)
        state.confusion, state.feedback_noise_multiplier = None, None
        with self._account_lock():  # runs sharing an account directory take turns
            account = self._account(state)
            if self.max_epsilon is not None:
                planned = [event_from_dict(e) for e in account["events"]] + [event]
                if not self._within(planned):
                    raise SiloRefused(
                        f"max_epsilon: answering would take silo {self.name!r} past its own budget "
                        f"of {self.max_epsilon:g} (the Renyi filter bound of its whole account at delta {self.delta:g})"
                    )
            # Recorded before the records are read, as the ledger does; the confusion counts of this
            # subsample are part of the same event (the effective noise multiplier of both).
            state.events = account["events"] + [event_to_dict(event)]
            state.releases = account["releases"] + [
                {"kind": "noised_sums", "event": len(state.events) - 1, "noise_std": mechanism.noise_std}
            ]
            self._write_account(state)
        keep = bool(request["keep_confusion"]) and mechanism.releases_feedback
        totals = self._totals(request, keep)
        sums = totals.sums if bound is None else clip_before_noise(totals.sums, float(bound), mechanism.noise_std)
        noised = mechanism.release(sums, self.noise)
        if keep:
            state.confusion = totals.confusion
            state.feedback_noise_multiplier = mechanism.feedback_noise_multiplier
        if self.shrink:  # post-processing in the silo's own estimate scale (placement 'local' only)
            scale = float(request["sampling_rate"]) * self.size
            noised = shrink_within(noised / scale, mechanism.noise_std / scale) * scale
        return {"sums": noised, "noise_std": mechanism.noise_std}

    def _within(self, events: list[Any]) -> bool:
        """Whether the Renyi filter bound of ``events`` (the whole account, counts included) stays within
        max_epsilon at the silo's delta (an accountant that fails on them: not within)."""
        try:
            spent = filter_epsilon(events, self.delta)
        except (ValueError, OverflowError, MemoryError):  # e.g. a multiplier so small no curve holds it
            return False
        return bool(np.isfinite(spent)) and spent <= float(self.max_epsilon)  # type: ignore[arg-type]

    def _noised_confusion(self, request: Mapping[str, Any], state: SiloState) -> dict[str, Any]:
        """The held counts at the feedback noise this silo charged with the sums; the request's
        multipliers are ignored (a coordinator cannot ask for less noise)."""
        if state.confusion is None:
            raise SiloRefused(
                "noised_confusion: no confusion counts held; ask noised_sums with keep_confusion "
                "and a feedback noise multiplier first (the feedback is charged with the sums)"
            )
        held, multiplier = state.confusion, state.feedback_noise_multiplier
        state.confusion, state.feedback_noise_multiplier = None, None  # released once, then dropped
        if multiplier is None:
            raise SiloRefused("noised_confusion: the sums request charged no feedback noise")
        indices = [int(i) for i in request["indices"]]
        if not indices or len(set(indices)) != len(indices) or not all(0 <= i < len(held) for i in indices):
            raise SiloRefused(f"indices: name distinct candidates among the {len(held)} scored")
        mechanism = GaussianScoreMechanism(
            noise_multiplier=1.0, clip_bound=1.0, num_candidates=len(held), feedback_noise_multiplier=multiplier
        )
        counts = held[indices]
        bound = request.get("value_bound")
        std = mechanism.confusion_noise_std(len(indices))
        if bound is not None:
            counts = clip_before_noise(counts, float(bound), std)
        self._record_release(
            state,
            {
                "kind": "noised_confusion",
                "event": len(self._account(state)["events"]) - 1,
                "noise_std": std,
                "matrices": len(indices),
            },
        )
        return {"confusion": mechanism.release_confusion(counts, self.noise), "noise_std": std}


def _mechanism(request: Mapping[str, Any]) -> GaussianScoreMechanism:
    feedback = request.get("feedback_noise_multiplier")
    return GaussianScoreMechanism(
        noise_multiplier=float(request["noise_multiplier"]),
        clip_bound=float(request["clip_bound"]),
        num_candidates=len(request["prompts"]) if "prompts" in request else int(request["num_candidates"]),
        feedback_noise_multiplier=None if feedback is None else float(feedback),
    )


__all__ = ["REQUEST_KINDS", "Silo", "SiloRefused", "SiloState"]
