"""Settings and result types of the L2 end-to-end canary audit, and the constants that
``audit.json`` records (modes, format version, the statement of what an audit can show).

The audit itself is described in :mod:`~dp_textgrad.audit.end_to_end.canary_audit`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from dp_textgrad.audit._asdict import AsDict
from dp_textgrad.audit.canaries.canary_set import SecretKind
from dp_textgrad.audit.canaries.insertion import DEFAULT_MAX_SHARE, DEFAULT_WARN_SHARE
from dp_textgrad.audit.membership.inference import ATTACKS as MEMBERSHIP_ATTACKS
from dp_textgrad.audit.membership.leakage import DEFAULT_TOP_KS
from dp_textgrad.audit.statistics.metrics import MIN_RESAMPLES

AuditMode = Literal["dp", "unsafe", "fewshot"]
AUDIT_MODES: tuple[str, ...] = ("dp", "unsafe", "fewshot")
DEFAULT_FEWSHOT_DEMOS = 8
FEWSHOT_NOTE = (
    "fewshot mode: no optimisation; the released prompt is the seed prompt plus raw private records "
    "(a naive few-shot prompt builder). NOT differentially private; no guarantee is claimed"
)

AUDIT_VERSION = 1
AUDIT_KIND = "audit_l2"
# Per-canary scores from the leakage measures, next to the membership attacks.
LEAKAGE_ATTACKS: tuple[str, ...] = ("prompt_text", "extraction", "exposure")
DEFAULT_FPRS: tuple[float, ...] = (0.1, 0.01, 0.001)

STATEMENT = (
    "An audit can prove a leak, never privacy. eps_lb is a lower bound at the stated confidence: above the "
    "claimed epsilon it shows a bug in the mechanism, the accounting or the code around them. Below it, it "
    "only says that these attacks, on these canaries in this one run, could not show more; with a few dozen "
    "canaries even a perfect attack cannot show a large epsilon. The Gaussian-DP value is an estimate tuned "
    "on the same scores (optimistic with small samples), never a bound."
)


@dataclass(frozen=True)
class CanaryAuditOptions(AsDict):
    """How the release is attacked and how the canaries are planted (the audit's settings).

    ``warn_share`` / ``max_share``: canary share of the private set above which
    insertion warns / refuses (library defaults 0.8% / 1%; a positive control on a
    small private set needs more, see docs/audit.md). ``n_exposure_references``:
    reference secrets ranked against each secret (exposure resolution log2(n + 1)
    bits; each costs one scored continuation per canary). ``k_pos`` / ``k_neg``: the
    one-run guesses ("in" for the k_pos highest scores, "out" for the k_neg lowest),
    fixed before the run; ``None`` means max(1, m // 4) each. ``attacks``: the
    membership attacks to run (those the engine cannot do are reported as
    unavailable). ``primary_attack``: the attack whose Gaussian-DP estimate is the
    headline (fixed beforehand; default ``reference``: released vs seed prompt, so
    only the release differs). ``n_resamples`` >= 1000 bootstrap resamples.
    """

    secret_kind: SecretKind = "mixed"
    warn_share: float = DEFAULT_WARN_SHARE
    max_share: float = DEFAULT_MAX_SHARE
    n_exposure_references: int = 15
    max_tokens: int = 24
    top_ks: tuple[int, ...] = DEFAULT_TOP_KS
    k_pos: int | None = None
    k_neg: int | None = None
    alpha: float = 0.05
    n_resamples: int = MIN_RESAMPLES
    fprs: tuple[float, ...] = DEFAULT_FPRS
    attacks: tuple[str, ...] = MEMBERSHIP_ATTACKS
    primary_attack: str = "reference"

    def __post_init__(self) -> None:
        if not 0 < self.warn_share <= self.max_share <= 1:
            raise ValueError(
                f"warn_share, max_share: need 0 < warn_share <= max_share <= 1, got {self.warn_share}, {self.max_share}"
            )
        for name in ("n_exposure_references", "max_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: must be an integer >= 1, got {value!r}")
        for name in ("k_pos", "k_neg"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"{name}: must be an integer >= 0 or None, got {value!r}")
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha: must be in (0, 1), got {self.alpha}")
        if (
            isinstance(self.n_resamples, bool)
            or not isinstance(self.n_resamples, int)
            or self.n_resamples < MIN_RESAMPLES
        ):
            raise ValueError(f"n_resamples: must be an integer >= {MIN_RESAMPLES}, got {self.n_resamples!r}")
        if not self.fprs or any(not 0 < f < 1 for f in self.fprs):
            raise ValueError(f"fprs: need target false positive rates in (0, 1), got {list(self.fprs)}")
        unknown = sorted(set(self.attacks) - set(MEMBERSHIP_ATTACKS))
        if unknown:
            raise ValueError(f"attacks: unknown {unknown}; choose from {list(MEMBERSHIP_ATTACKS)}")
        if self.primary_attack not in (*LEAKAGE_ATTACKS, *self.attacks):
            raise ValueError(
                f"primary_attack: {self.primary_attack!r} is not among the attacks run "
                f"({[*LEAKAGE_ATTACKS, *self.attacks]})"
            )

    def guesses(self, m: int) -> tuple[int, int]:
        """(k_pos, k_neg) for ``m`` canaries; defaults max(1, m // 4) each, capped so k_pos + k_neg <= m."""
        default = max(1, m // 4)
        k_pos = default if self.k_pos is None else self.k_pos
        k_neg = default if self.k_neg is None else self.k_neg
        if k_pos + k_neg > m:
            if self.k_pos is not None or self.k_neg is not None:
                raise ValueError(f"k_pos, k_neg: {k_pos} + {k_neg} guesses exceed the {m} canaries")
            k_pos, k_neg = (m + 1) // 2, m // 2
        return k_pos, k_neg


@dataclass(frozen=True)
class CanaryAuditResult:
    """The outcome of one L2 audit (``audit`` is exactly what ``audit.json`` holds)."""

    run_dir: Path
    audit: dict[str, Any]
    seconds: float

    @property
    def eps_lb(self) -> float:
        return float(self.audit["eps_lb"]["epsilon"])

    @property
    def claimed_epsilon(self) -> float | None:
        return self.audit["claim"]["epsilon"]

    @property
    def violation(self) -> bool:
        return bool(self.audit["violation"])

    @property
    def leak_detected(self) -> bool:
        return bool(self.audit["leak_detected"])

    @property
    def verdict(self) -> str:
        return str(self.audit["verdict"])
