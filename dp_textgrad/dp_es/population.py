"""Candidate prompts and the population that evolves them.

A candidate holds only public text (its prompt) and DP-released statistics (noisy
estimates with their noise standard deviation), so the whole population, including
its archive, can be saved and shared: nothing in it is raw private data.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dp_textgrad.dp_es.estimates import ReleasedScores, shrink_estimates
from dp_textgrad.privacy.data import Private, PrivateBatch, PrivateDataError, PrivateDataset

ShrinkFn = Callable[[np.ndarray, np.ndarray], np.ndarray]

_WHITESPACE = re.compile(r"\s+")


def normalise_text(text: str) -> str:
    """The deduplication key of a prompt: case-folded, whitespace collapsed."""
    return _WHITESPACE.sub(" ", text).strip().casefold()


def make_candidate_id(text: str, generation: int) -> str:
    """A reproducible id: the generation plus a hash of the normalised text.

    Two operators that produce the same prompt in one generation get the same id,
    so the duplicate is recognised; the same text made again later gets a new id.
    """
    digest = hashlib.sha256(normalise_text(text).encode("utf-8")).hexdigest()[:10]
    return f"g{generation}-{digest}"


@dataclass(frozen=True)
class ScoreEstimate:
    """One DP-released estimate of a candidate's mean score."""

    generation: int
    estimate: float
    noise_std: float

    def __post_init__(self) -> None:
        if not math.isfinite(self.estimate):
            raise ValueError(f"estimate: must be finite, got {self.estimate}")
        if not math.isfinite(self.noise_std) or self.noise_std < 0:
            raise ValueError(f"noise_std: must be a finite number >= 0, got {self.noise_std}")

    def to_dict(self) -> dict[str, Any]:
        return {"generation": self.generation, "estimate": self.estimate, "noise_std": self.noise_std}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ScoreEstimate:
        return cls(int(data["generation"]), float(data["estimate"]), float(data["noise_std"]))


@dataclass
class Candidate:
    """A candidate prompt: public text, where it came from, and its noisy evaluations.

    ``unsafe`` marks text that was built from raw private examples (unsafe mode); the
    mark is inherited by children, and public-mode mutation refuses such parents.
    """

    id: str
    text: str
    parent_ids: tuple[str, ...] = ()
    operator: str = "seed"
    operator_meta: dict[str, Any] = field(default_factory=dict)
    generation: int = 0
    evaluations: list[ScoreEstimate] = field(default_factory=list)
    unsafe: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.text, (Private, PrivateDataset, PrivateBatch)):
            raise PrivateDataError("text: a candidate prompt cannot hold private data")
        if not isinstance(self.text, str):
            raise TypeError(f"text: a candidate prompt must be a string, got {type(self.text).__name__}")
        self.text = str(self.text)  # drop any PublicText subclass: candidate provenance is implied
        self.parent_ids = tuple(self.parent_ids)

    @classmethod
    def new(
        cls,
        text: str,
        *,
        generation: int,
        operator: str,
        parent_ids: Iterable[str] = (),
        operator_meta: Mapping[str, Any] | None = None,
        unsafe: bool = False,
    ) -> Candidate:
        """A fresh candidate with a reproducible id."""
        return cls(
            id=make_candidate_id(text, generation),
            text=str(text),
            parent_ids=tuple(parent_ids),
            operator=operator,
            operator_meta=dict(operator_meta or {}),
            generation=generation,
            unsafe=unsafe,
        )

    @property
    def key(self) -> str:
        """Deduplication key (normalised text)."""
        return normalise_text(self.text)

    @property
    def mean_estimate(self) -> float | None:
        """Inverse-variance pooled estimate over all evaluations; None if never evaluated."""
        pooled = self._pooled()
        return None if pooled is None else pooled[0]

    @property
    def estimate_std(self) -> float | None:
        """Standard deviation of the pooled estimate; None if never evaluated."""
        pooled = self._pooled()
        return None if pooled is None else pooled[1]

    def _pooled(self) -> tuple[float, float] | None:
        if not self.evaluations:
            return None
        estimates = np.array([e.estimate for e in self.evaluations], dtype=float)
        stds = np.array([e.noise_std for e in self.evaluations], dtype=float)
        exact = stds == 0.0
        if exact.any():  # noiseless evaluations (tests, unsafe baselines) dominate noisy ones
            return float(estimates[exact].mean()), 0.0
        weights = 1.0 / stds**2
        return float((weights * estimates).sum() / weights.sum()), float(1.0 / math.sqrt(weights.sum()))

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "text": self.text,
            "parent_ids": list(self.parent_ids),
            "operator": self.operator,
            "operator_meta": _jsonable(self.operator_meta, "operator_meta"),
            "generation": self.generation,
            "evaluations": [e.to_dict() for e in self.evaluations],
            "unsafe": self.unsafe,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Candidate:
        return cls(
            id=str(data["id"]),
            text=str(data["text"]),
            parent_ids=tuple(data.get("parent_ids", ())),
            operator=str(data.get("operator", "seed")),
            operator_meta=dict(data.get("operator_meta", {})),
            generation=int(data.get("generation", 0)),
            evaluations=[ScoreEstimate.from_dict(e) for e in data.get("evaluations", ())],
            unsafe=bool(data.get("unsafe", False)),
        )


def _jsonable(value: Any, where: str) -> Any:
    """A JSON-able copy of operator metadata (numpy scalars become Python numbers)."""
    if isinstance(value, (Private, PrivateDataset, PrivateBatch)):
        raise PrivateDataError(f"{where}: private data cannot be stored in a candidate")
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v, where) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, where) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return str(value)
    raise TypeError(f"{where}: {type(value).__name__} is not JSON-able; store numbers, text, lists or dicts")


class PopulationManager:
    """The current population, its archive, and elitist replacement.

    ``size``: candidates per generation; ``elites``: best candidates carried over
    unchanged. Ranking uses shrunk estimates (James-Stein / empirical Bayes over the
    current population: free post-processing of DP-released scores). ``rng`` (seeded,
    non-private) picks which children fill the free slots when there are too many.
    """

    def __init__(
        self, size: int, elites: int, rng: np.random.Generator | None = None, *, shrink: ShrinkFn | None = None
    ) -> None:
        if size < 1:
            raise ValueError(f"size: the population needs at least 1 candidate, got {size}")
        if not 0 <= elites <= size:
            raise ValueError(f"elites: must be between 0 and size ({size}), got {elites}")
        self.size = size
        self.elites = elites
        self.rng = rng if rng is not None else np.random.default_rng(0)
        self._shrink = shrink or shrink_estimates
        self._population: list[str] = []
        self._archive: dict[str, Candidate] = {}
        self.generation = 0

    # -- views ------------------------------------------------------------------------
    @property
    def candidates(self) -> list[Candidate]:
        """The current population, in order."""
        return [self._archive[cid] for cid in self._population]

    @property
    def archive(self) -> list[Candidate]:
        """Every candidate ever made, in creation order (for the report)."""
        return list(self._archive.values())

    def get(self, candidate_id: str) -> Candidate:
        try:
            return self._archive[candidate_id]
        except KeyError:
            raise KeyError(f"candidate_id: no candidate {candidate_id!r} in the archive") from None

    def __len__(self) -> int:
        return len(self._population)

    # -- building ---------------------------------------------------------------------
    def initialise(
        self, seed: Candidate | str, variants: Sequence[Candidate] = (), *, seeded: Sequence[Candidate] = ()
    ) -> list[Candidate]:
        """Start from the seed prompt plus deduplicated variants (seed first), up to ``size``.

        ``seeded`` (e.g. the public warm-up's prompts, best first) come right after the seed, in
        order; ``variants`` fill what is left. Every candidate given is archived, kept or not.
        """
        if self._archive:
            raise RuntimeError("initialise: the population is already initialised; make a new PopulationManager")
        if isinstance(seed, str):
            seed = Candidate.new(seed, generation=0, operator="seed")
        if not seed.text.strip():
            raise ValueError("seed: the seed prompt is empty; give a starting instruction")
        self.generation = seed.generation
        self._population = []
        self._admit(seed)
        for variant in (*seeded, *variants):
            self._remember(variant)
        seen = {seed.key}
        self._fill(list(seeded), seen, ranked=True)
        self._fill([v for v in variants], seen)
        return self.candidates

    def _remember(self, candidate: Candidate) -> None:
        self._archive.setdefault(candidate.id, candidate)

    def _admit(self, candidate: Candidate) -> None:
        self._remember(candidate)
        self._population.append(candidate.id)

    def _fill(self, pool: Sequence[Candidate], seen: set[str], *, ranked: bool = False) -> None:
        """Add unseen candidates from ``pool`` until the population is full.

        A ``ranked`` pool is taken in order; otherwise surplus candidates are dropped at random.
        """
        fresh: list[Candidate] = []
        for cand in pool:
            if cand.key in seen or not cand.text.strip():
                continue
            seen.add(cand.key)
            fresh.append(cand)
        free = self.size - len(self._population)
        if ranked:
            fresh = fresh[:free]
        elif len(fresh) > free:  # too many: a seeded random subset, kept in the given order
            keep = np.sort(self.rng.choice(len(fresh), size=free, replace=False))
            fresh = [fresh[i] for i in keep]
        for cand in fresh:
            self._admit(cand)

    # -- scores -----------------------------------------------------------------------
    def record(self, noisy: ReleasedScores, generation: int) -> None:
        """Store DP-released estimates (``noisy.estimates[i]`` belongs to ``noisy.candidate_ids[i]``)."""
        ids = list(noisy.candidate_ids)
        estimates = np.asarray(noisy.estimates, dtype=float).reshape(-1)
        if len(ids) != len(estimates):
            raise ValueError(f"noisy: {len(ids)} candidate ids but {len(estimates)} estimates")
        stds = np.broadcast_to(np.asarray(noisy.noise_std_estimate, dtype=float), estimates.shape)
        for cid, est, std in zip(ids, estimates, stds):
            self.get(cid).evaluations.append(ScoreEstimate(int(generation), float(est), float(std)))

    def shrunk_estimates(self) -> dict[str, float]:
        """Shrunk estimates of the evaluated candidates of the current population."""
        evaluated = [c for c in self.candidates if c.evaluations]
        if not evaluated:
            return {}
        means = np.array([c.mean_estimate for c in evaluated], dtype=float)
        variances = np.array([c.estimate_std for c in evaluated], dtype=float) ** 2
        if len(evaluated) == 1:  # nothing to shrink towards
            return {evaluated[0].id: float(means[0])}
        shrunk = np.asarray(self._shrink(means, variances), dtype=float).reshape(-1)
        if shrunk.shape != means.shape:
            raise ValueError(f"shrink: returned {shrunk.shape[0]} values for {means.shape[0]} candidates")
        return {c.id: float(s) for c, s in zip(evaluated, shrunk)}

    def best(self, n: int = 1) -> list[Candidate]:
        """The ``n`` best candidates of the current population by shrunk estimate.

        Unevaluated candidates come after evaluated ones. When the noise swamps the spread,
        empirical Bayes shrinks every estimate to the same grand mean; the pooled noisy
        means (equally DP) then break the tie instead of population order.
        """
        if n < 0:
            raise ValueError(f"n: must be >= 0, got {n}")
        shrunk = self.shrunk_estimates()

        def key(i: int) -> tuple:
            cid = self._population[i]
            raw = self._archive[cid].mean_estimate
            return (cid not in shrunk, -round(shrunk.get(cid, 0.0), 9), -(raw if raw is not None else 0.0), i)

        order = sorted(range(len(self._population)), key=key)
        return [self._archive[self._population[i]] for i in order[:n]]

    def next_generation(
        self, children: Sequence[Candidate], parents: Sequence[Candidate] | None = None
    ) -> list[Candidate]:
        """Elites + deduplicated children; the best of the rest fill any free slots.

        Elites are the first ``self.elites`` of ``parents`` when given (best first, e.g.
        the ordered output of a DP top-k selection when no scores were released),
        otherwise the top ``self.elites`` by shrunk estimate. Every child is archived,
        kept or not.
        """
        ranked = self.best(len(self._population))
        kept = list(parents)[: self.elites] if parents is not None else ranked[: self.elites]
        for cand in kept:
            if cand.id not in self._archive:
                raise KeyError(f"parents: candidate {cand.id!r} is not part of this population")
        for child in children:
            self._remember(child)
        self._population = []
        seen: set[str] = set()
        for cand in kept:
            if cand.key not in seen:
                seen.add(cand.key)
                self._admit(cand)
        self._fill(list(children), seen)
        self._fill([c for c in ranked if c.id not in self._population], seen, ranked=True)
        self.generation += 1
        return self.candidates

    # -- reporting --------------------------------------------------------------------
    def lineage(self, candidate_id: str) -> list[Candidate]:
        """The candidate followed by all its ancestors (breadth first, each once)."""
        start = self.get(candidate_id)
        chain: list[Candidate] = []
        seen: set[str] = set()
        queue = [start.id]
        while queue:
            cid = queue.pop(0)
            if cid in seen or cid not in self._archive:
                continue  # an unknown parent (e.g. from another run) ends that branch
            seen.add(cid)
            cand = self._archive[cid]
            chain.append(cand)
            queue.extend(cand.parent_ids)
        return chain

    def to_dict(self) -> dict[str, Any]:
        """JSON-able state: public prompt texts and noisy statistics only."""
        return {
            "size": self.size,
            "elites": self.elites,
            "generation": self.generation,
            "population": list(self._population),
            "archive": [c.to_dict() for c in self._archive.values()],
            "rng_state": _jsonable(self.rng.bit_generator.state, "rng_state"),
        }

    @classmethod
    def from_dict(
        cls, data: Mapping[str, Any], rng: np.random.Generator | None = None, *, shrink: ShrinkFn | None = None
    ) -> PopulationManager:
        """Rebuild a manager; ``rng`` defaults to a PCG64 generator restored to the saved state."""
        if rng is None:
            rng = np.random.default_rng()
            state = data.get("rng_state")
            if state is not None:
                try:
                    rng.bit_generator.state = dict(state)
                except (TypeError, ValueError, KeyError):
                    raise ValueError("rng_state: saved generator state does not fit PCG64; pass rng=") from None
        manager = cls(int(data["size"]), int(data["elites"]), rng, shrink=shrink)
        for cdata in data.get("archive", ()):
            cand = Candidate.from_dict(cdata)
            manager._archive[cand.id] = cand
        missing = [cid for cid in data.get("population", ()) if cid not in manager._archive]
        if missing:
            raise ValueError(f"population: ids {missing} are not in the archive; the saved state is corrupt")
        manager._population = list(data.get("population", ()))
        manager.generation = int(data.get("generation", 0))
        return manager
