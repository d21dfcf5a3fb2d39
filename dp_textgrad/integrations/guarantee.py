"""The DP guarantee an integration hands back with what it released (a compiled DSPy program, a
GEPA candidate): released values only, built from the run's result in one place."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dp_textgrad.workflow import RunOutcome

#: The attribute (and a DSPy predictor's saved-state key) that holds a guarantee.
STATE_KEY = "dp_guarantee"


@dataclass(frozen=True)
class DPGuarantee:
    """What a released prompt is private for: released values only.

    ``epsilon`` and ``delta``: the run's (epsilon, delta) with respect to adding or removing one
    private record (a DSPy ``trainset`` example, a GEPA ``trainset`` instance), epsilon being the
    smallest valid bound of the ledger's accountants; ``accountant``: the accountant that gave it;
    ``epsilons``: every accountant's bound; ``optimized``: what was optimized (the DSPy predictor's
    names, the GEPA candidate's components); ``run_id``: the name of the run directory (its
    ``ledger.jsonl`` is the proof; the optimizer's ``outcome.run_dir`` is where it lies: a local
    path, which the guarantee does not carry into a saved program); ``estimate``: the released
    prompt's DP estimate of the mean score in [0, 1] (None when the run released none); ``noise``:
    how the noise was drawn; ``differentially_private``: False when the run was not DP
    (``privacy="off"``, ``mode="unsafe"``) or used seeded, insecure noise (``insecure_noise_seed``):
    then the numbers describe the plan, not a guarantee.
    """

    epsilon: float
    delta: float
    accountant: str
    epsilons: dict[str, float] = field(default_factory=dict)
    optimized: str = ""
    run_id: str = ""
    estimate: float | None = None
    noise: str | None = None
    differentially_private: bool = True

    @classmethod
    def of_run(cls, outcome: RunOutcome, optimized: str) -> DPGuarantee:
        """The guarantee of a finished run (``dp_textgrad.optimize``'s outcome)."""
        result = outcome.result
        config = outcome.optimizer.config if outcome.optimizer is not None else None
        insecure = config is not None and getattr(config, "insecure_noise_seed", None) is not None
        private = not result.unsafe and not insecure
        # A run that is not DP has no accountant's bound to show (its ledger's zeros would read as
        # "nothing spent"): epsilon is infinite and the accountants are left out.
        epsilons = {str(name): float(value) for name, value in result.epsilons.items()} if not result.unsafe else {}
        finite = {name: value for name, value in epsilons.items() if math.isfinite(value)}
        return cls(
            epsilon=float(result.epsilon) if not result.unsafe else math.inf,
            delta=float(result.delta),
            accountant=min(finite, key=finite.__getitem__) if finite else "",
            epsilons=epsilons,
            optimized=optimized,
            run_id=Path(outcome.run_dir).name,
            estimate=None if result.estimate is None else float(result.estimate),
            noise=None if result.noise is None else str(result.noise),
            differentially_private=private,
        )

    def __str__(self) -> str:
        if not self.differentially_private:
            return (
                f"NOT differentially private ({self.optimized or 'prompt'} from run {self.run_id}): the run had "
                "privacy off, ran in unsafe mode or drew seeded noise; the released text may reveal its records"
            )
        return (
            f"({self.epsilon:g}, {self.delta:g})-DP for adding or removing one private record "
            f"({self.accountant} accountant; run {self.run_id})"
        )

    def as_dict(self) -> dict[str, Any]:
        """The guarantee as JSON-ready values (strict JSON: an infinite epsilon is the string "inf")."""
        values = asdict(self)
        if not math.isfinite(self.epsilon):
            values["epsilon"] = "inf"
        return values

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> DPGuarantee:
        """A guarantee from :meth:`as_dict`'s values (unknown keys, from a newer version, are ignored)."""
        known = {name: values[name] for name in cls.__dataclass_fields__ if name in values}
        if "run_id" not in known and isinstance(values.get("run_dir"), str):  # saved before run_id
            known["run_id"] = Path(values["run_dir"]).name
        private = known.get("differentially_private", True) is not False
        if not private and known.get("epsilon") in (None, "inf", "Infinity"):
            known["epsilon"] = math.inf  # older saves of a privacy-off program wrote null
        try:
            guarantee = cls(**known)
        except TypeError as exc:
            raise ValueError(f"dp_guarantee: not a saved DPGuarantee ({exc})") from None
        if not isinstance(guarantee.epsilon, (int, float)) or isinstance(guarantee.epsilon, bool):
            raise ValueError("dp_guarantee: epsilon must be a number")
        if private and not math.isfinite(guarantee.epsilon):
            raise ValueError("dp_guarantee: a differentially private guarantee needs a finite epsilon")
        return guarantee

    @classmethod
    def of(cls, program: Any) -> DPGuarantee | None:
        """The guarantee a DSPy program carries: the one ``DPES.compile`` attached, or the one a
        saved compiled program's state put into this program's predictor by ``program.load(path)``.
        None when the program carries none."""
        found = getattr(program, STATE_KEY, None)
        if isinstance(found, DPGuarantee):
            return found
        named = getattr(program, "named_predictors", None)
        for _, predictor in named() if callable(named) else []:
            found = getattr(predictor, STATE_KEY, None)
            if isinstance(found, DPGuarantee):
                return found
            if isinstance(found, dict):
                return cls.from_dict(found)
        return None


__all__ = ["STATE_KEY", "DPGuarantee"]
