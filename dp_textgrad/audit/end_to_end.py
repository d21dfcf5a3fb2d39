"""L2 end-to-end canary audit: plant canaries, run the real optimiser, attack the release.

One audit is one optimisation run (a one-run audit, Steinke, Nasr & Jagielski 2023):

1. ``m`` canaries are generated for the task (:func:`canaries_for_task`); each has a
   Bernoulli(1/2) inclusion bit. The included ones (members) are inserted evenly
   among the auditor's canary-free private records (``include="mask"``); the
   excluded ones (non-members) never reach the optimiser.
2. :func:`dp_textgrad.workflow.run` optimises a prompt on that private set into a run
   directory (``mode="dp"``: the library's DP-ES; ``mode="unsafe"``: the same loop with
   ``config.unsafe_examples`` raw private records, canaries included, shown to the
   mutator, the positive control that must leak; ``mode="fewshot"``: no optimisation, the
   release is the seed prompt plus ``n_demos`` raw private records, what a naive few-shot
   prompt builder ships: NOT private, the positive control that checks the attacks and the
   audit's plumbing on the real model).
3. The released prompt is attacked, for ALL canaries: secret in the prompt text
   (verbatim, longest common substring), greedy extraction, top-k token hit rates,
   exposure, and the membership scores of :func:`membership_scores` (LOSS, zlib,
   Min-K%, Min-K%++, reference = released vs seed prompt, ReCaLL).
4. Per attack: ROC-AUC and PR-AUC with stratified bootstrap CIs, TPR at low FPR where
   the sample allows, Cohen's d (with CI) / Hedges' g with magnitude, the one-run
   lower bound, and a Gaussian-DP *estimate*.
5. ``eps_lb`` (the largest one-run bound over the attacks, each at alpha / number of
   attacks, so the maximum holds at confidence 1 - alpha) is compared with the
   epsilon the run's ledger claims; ``audit.json`` is written into the run directory,
   the run report gains an audit section, and one line goes to the run log.

What the result means: ``eps_lb`` above the claim, or a member's secret in the
release of a DP run (whose mutator never sees private text), is a bug. Anything
else proves nothing about privacy: a few dozen canaries in one run can only show
small lower bounds, whatever the mechanism. ``audit.json`` holds canary ids,
inclusion bits, scores and counts; never a secret, a record or generated text.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from dp_textgrad.audit.bounds import gaussian_dp_estimate, one_run_bound_from_scores, one_run_eps_lower_bound
from dp_textgrad.audit.canaries import (
    DEFAULT_MAX_SHARE,
    DEFAULT_WARN_SHARE,
    CanarySet,
    SecretKind,
    canaries_for_task,
    insert_canaries,
    save_canaries,
    with_private_records,
)
from dp_textgrad.audit.leakage import DEFAULT_TOP_KS, exposure, greedy_extraction, prompt_leakage, topk_hit_rates
from dp_textgrad.audit.membership import ATTACKS as MEMBERSHIP_ATTACKS
from dp_textgrad.audit.membership import membership_scores
from dp_textgrad.audit.stats import MIN_RESAMPLES, bootstrap_ci, compare_groups, tpr_at_fpr
from dp_textgrad.report import AUDIT_FILE_NAME, AUDIT_FORMAT
from dp_textgrad.tasks.base import ClassificationTask, Example

if TYPE_CHECKING:
    from dp_textgrad.dp_es.config import DPESConfig
    from dp_textgrad.dp_es.controller import GenerationReport
    from dp_textgrad.engines.base import Engine

AuditMode = Literal["dp", "unsafe", "fewshot"]
AUDIT_MODES: tuple[str, ...] = ("dp", "unsafe", "fewshot")
DEFAULT_FEWSHOT_DEMOS = 8
FEWSHOT_NOTE = ("fewshot mode: no optimisation; the released prompt is the seed prompt plus raw private records "
                "(a naive few-shot prompt builder). NOT differentially private; no guarantee is claimed")

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
class CanaryAuditOptions:
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
            raise ValueError(f"warn_share, max_share: need 0 < warn_share <= max_share <= 1, "
                             f"got {self.warn_share}, {self.max_share}")
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
        if isinstance(self.n_resamples, bool) or not isinstance(self.n_resamples, int) \
                or self.n_resamples < MIN_RESAMPLES:
            raise ValueError(f"n_resamples: must be an integer >= {MIN_RESAMPLES}, got {self.n_resamples!r}")
        if not self.fprs or any(not 0 < f < 1 for f in self.fprs):
            raise ValueError(f"fprs: need target false positive rates in (0, 1), got {list(self.fprs)}")
        unknown = sorted(set(self.attacks) - set(MEMBERSHIP_ATTACKS))
        if unknown:
            raise ValueError(f"attacks: unknown {unknown}; choose from {list(MEMBERSHIP_ATTACKS)}")
        if self.primary_attack not in (*LEAKAGE_ATTACKS, *self.attacks):
            raise ValueError(f"primary_attack: {self.primary_attack!r} is not among the attacks run "
                             f"({[*LEAKAGE_ATTACKS, *self.attacks]})")

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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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


# -- attacking a released prompt ---------------------------------------------------------------


def _finite_or_none(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


def _roc_points(members: np.ndarray, nonmembers: np.ndarray) -> dict[str, list[float]]:
    from sklearn.metrics import roc_curve

    labels = np.r_[np.ones(members.size), np.zeros(nonmembers.size)]
    fpr, tpr, _ = roc_curve(labels, np.r_[members, nonmembers])
    return {"fpr": [round(float(x), 6) for x in fpr], "tpr": [round(float(x), 6) for x in tpr]}


def _attack_statistics(scores: np.ndarray, included: np.ndarray, *, delta: float, alpha_each: float,
                       k_pos: int, k_neg: int, options: CanaryAuditOptions, seed: int) -> dict[str, Any]:
    """Everything one attack's per-canary scores give (members are the positive class)."""
    members, nonmembers = scores[included], scores[~included]
    out: dict[str, Any] = {"available": True, "n_members": int(members.size), "n_nonmembers": int(nonmembers.size)}
    one_run = one_run_bound_from_scores(scores, included, k_pos=k_pos, k_neg=k_neg, delta=delta, alpha=alpha_each)
    out["one_run"] = one_run.to_dict()
    if members.size < 2 or nonmembers.size < 2:
        out["note"] = (f"group statistics need at least 2 members and 2 non-members, got {members.size} and "
                       f"{nonmembers.size}; only the one-run bound is computed")
        return out
    comparison = compare_groups(members, nonmembers, n_resamples=options.n_resamples, seed=seed)
    pr = bootstrap_ci(members, nonmembers, "pr_auc", n_resamples=options.n_resamples, seed=seed)
    d = bootstrap_ci(members, nonmembers, "cohens_d", n_resamples=options.n_resamples, seed=seed)
    out.update({
        "auc": asdict(comparison.auc),
        "pr_auc": asdict(pr),
        "mean_difference": asdict(comparison.mean_difference),
        "cohens_d": asdict(d),
        "hedges_g": comparison.hedges_g,
        "magnitude": comparison.magnitude,
        "statistically_significant": comparison.statistically_significant,
        "practically_significant": comparison.practically_significant,
        "tpr_at_fpr": [asdict(tpr_at_fpr(members, nonmembers, f)) for f in options.fprs],
        "gdp_estimate": gaussian_dp_estimate(members, nonmembers, delta).to_dict(),
        "roc": _roc_points(members, nonmembers),
    })
    return out


def attack_release(
    engine: "Engine",
    task: ClassificationTask,
    prompt: str,
    canary_set: CanarySet,
    *,
    delta: float,
    reference_prompt: str | None = None,
    nonmember_prefix: Sequence[Example] | None = None,
    options: CanaryAuditOptions | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Attack a released ``prompt`` with every measure, for all canaries (members and not).

    Returns the ``leakage``, ``attacks``, ``per_canary``, ``eps_lb`` and ``gdp_estimate``
    parts of ``audit.json`` (numbers, ids and notes only). ``reference_prompt``
    (default: the task's seed prompt) is the baseline of the ``reference`` attack;
    ``delta`` is the run's delta (bounds and estimates are stated at it).
    """
    options = options or CanaryAuditOptions()
    canaries = list(canary_set)
    m = len(canaries)
    included = canary_set.included_mask
    k_pos, k_neg = options.guesses(m)
    notes: list[str] = []

    text = prompt_leakage(prompt, canaries)
    extraction = greedy_extraction(engine, task, prompt, canaries, max_tokens=options.max_tokens)
    top_k = topk_hit_rates(engine, task, prompt, canaries, options.top_ks)
    exposures = exposure(engine, task, prompt, canary_set,
                         n_references=min(options.n_exposure_references, len(canary_set.reference_secrets)))
    membership = membership_scores(engine, task, prompt, [c.text for c in canaries],
                                   reference_prompt=reference_prompt, nonmember_prefix=nonmember_prefix,
                                   attacks=options.attacks)

    per_attack_scores: dict[str, np.ndarray | None] = {
        "prompt_text": np.array([mt.lcs_fraction for mt in text.matches]),
        "extraction": np.array([o.matched_chars / o.secret_chars for o in extraction.outcomes]),
        "exposure": np.array([e.exposure for e in exposures]),
    }
    unavailable: dict[str, str] = {}
    for name, result in membership.items():
        if result.scores is None:
            per_attack_scores[name] = None
            unavailable[name] = result.note
        elif not np.all(np.isfinite(result.scores)):
            per_attack_scores[name] = None
            unavailable[name] = "some scores are not finite numbers"
        else:
            per_attack_scores[name] = np.asarray(result.scores, dtype=float)
    available = [name for name, values in per_attack_scores.items() if values is not None]
    # Bonferroni over the attacks (fixed by the engine's abilities, not by the scores):
    # the largest of the per-attack bounds then holds at confidence 1 - alpha.
    alpha_each = options.alpha / len(available)
    attacks: dict[str, Any] = {}
    for index, name in enumerate(per_attack_scores):
        values = per_attack_scores[name]
        if values is None:
            attacks[name] = {"available": False, "note": unavailable[name]}
            continue
        attacks[name] = _attack_statistics(values, included, delta=delta, alpha_each=alpha_each, k_pos=k_pos,
                                           k_neg=k_neg, options=options, seed=seed + index)

    best_attack = max(available, key=lambda a: (attacks[a]["one_run"]["epsilon"], -available.index(a)))
    best = attacks[best_attack]["one_run"]
    primary = options.primary_attack
    if "gdp_estimate" not in attacks.get(primary, {}):
        primary = next((a for a in ("loss", *available) if "gdp_estimate" in attacks.get(a, {})), primary)
    gdp = None
    if "gdp_estimate" in attacks.get(primary, {}):
        gdp = {**attacks[primary]["gdp_estimate"], "attack": primary,
               "note": "the pre-registered attack's estimate; its threshold is tuned on the same scores, so it "
                       "is optimistic with few canaries (noise alone often gives a few units at small delta): "
                       "an estimate, never a bound"}
        if primary != options.primary_attack:
            notes.append(f"primary attack {options.primary_attack!r} unavailable; the estimate uses {primary!r}")
    if any(r.token_rate is None for r in top_k):
        notes.extend(sorted({r.note for r in top_k if r.note}))

    per_canary = []
    for i, canary in enumerate(canaries):
        per_canary.append({
            "canary_id": canary.canary_id,
            "included": bool(canary.included),
            "verbatim": bool(text.matches[i].verbatim_normalised),
            "extracted": bool(extraction.outcomes[i].extracted),
            "exposure_rank": int(exposures[i].rank),
            "scores": {name: (None if values is None else float(values[i]))
                       for name, values in per_attack_scores.items()},
        })

    def count(flags: Sequence[bool], member: bool) -> int:
        return int(sum(1 for flag, inc in zip(flags, included) if flag and bool(inc) == member))

    verbatim = [mt.verbatim_normalised for mt in text.matches]
    extracted = [o.extracted for o in extraction.outcomes]
    exposure_values = np.array([e.exposure for e in exposures])
    leakage = {
        "prompt_text": {
            "verbatim_members": count(verbatim, True),
            "verbatim_nonmembers": count(verbatim, False),
            "verbatim_exact": int(sum(mt.verbatim for mt in text.matches)),
            "verbatim_rate": text.verbatim_rate,
            "max_lcs_fraction": text.max_lcs_fraction,
            "mean_lcs_fraction": text.mean_lcs_fraction,
        },
        "extraction": {
            "extracted_members": count(extracted, True),
            "extracted_nonmembers": count(extracted, False),
            "rate": extraction.rate,
            "mean_matched_fraction": extraction.mean_matched_fraction,
            "max_tokens": options.max_tokens,
        },
        "top_k": [asdict(r) for r in top_k],
        "exposure": {
            "mean_members": _finite_or_none(float(exposure_values[included].mean())) if included.any() else None,
            "mean_nonmembers": (_finite_or_none(float(exposure_values[~included].mean()))
                                if (~included).any() else None),
            "max": float(exposure_values.max()),
            "max_possible": float(exposures[0].max_exposure),
            "n_references": int(exposures[0].universe_size - 1),
        },
    }
    return {
        "leakage": leakage,
        "attacks": attacks,
        "per_canary": per_canary,
        "eps_lb": {
            "epsilon": float(best["epsilon"]),
            "attack": best_attack if best["epsilon"] > 0 else None,
            "alpha": options.alpha,
            "alpha_per_attack": alpha_each,
            "n_attacks": len(available),
            "k_pos": k_pos,
            "k_neg": k_neg,
            "delta": delta,
            # What a perfect attack (every guess right) would show with these m, guesses and alpha:
            # no audit with these settings can report more, whatever the mechanism does.
            "ceiling": one_run_eps_lower_bound(m, k_pos + k_neg, k_pos + k_neg, delta, alpha_each).epsilon,
            "method": "steinke-nasr-jagielski one-run; the largest per-attack bound, each at alpha / n_attacks",
        },
        "gdp_estimate": gdp,
        "notes": notes,
    }


# -- verdicts -------------------------------------------------------------------------------


def _judge(mode: AuditMode, claim: float | None, part: dict[str, Any]) -> dict[str, Any]:
    """Violation, leak signals and a one-line verdict from the attack results."""
    leakage, eps_lb = part["leakage"], part["eps_lb"]["epsilon"]
    signals = []
    if leakage["prompt_text"]["verbatim_members"]:
        signals.append(f"{leakage['prompt_text']['verbatim_members']} member secret(s) verbatim in the release")
    if leakage["extraction"]["extracted_members"]:
        signals.append(f"{leakage['extraction']['extracted_members']} member secret(s) extracted by greedy decoding")
    if eps_lb > 0:
        signals.append(f"one-run eps_lb {eps_lb:.3f} > 0 ({part['eps_lb']['attack']})")
    significant = sorted(name for name, a in part["attacks"].items()
                         if a.get("available") and "auc" in a and a["auc"]["low"] > 0.5)
    violation = False
    reasons = []
    if mode == "dp":
        if claim is not None and eps_lb > claim:
            violation = True
            reasons.append(f"eps_lb {eps_lb:.3f} exceeds the claimed epsilon {claim:.3f}")
        ceiling = part["eps_lb"].get("ceiling")
        if claim is not None and ceiling is not None and ceiling <= claim:
            part.setdefault("notes", []).append(
                f"with these settings even a perfect attack shows at most eps_lb {ceiling:.3f} <= the claim "
                f"{claim:.3f}: the bound cannot flag a violation here (more canaries can)")
        if leakage["prompt_text"]["verbatim_members"]:
            # No private text reaches the mutator of a DP run: a copied secret is a bug, not noise.
            violation = True
            reasons.append("a member's secret appears verbatim in the release of a DP run")
        if violation:
            verdict = "VIOLATION: " + "; ".join(reasons)
        else:
            verdict = (f"no violation shown: eps_lb {eps_lb:.3f} <= claimed epsilon "
                       f"{claim:.3f}" if claim is not None else "no violation shown")
            verdict += " (this proves nothing about privacy)"
    else:
        control = "the few-shot positive control, NOT private," if mode == "fewshot" else "the positive control"
        verdict = (f"LEAK DETECTED ({control} works): " + "; ".join(signals) if signals else
                   f"NO LEAK DETECTED: {control} failed to show a leak (see docs/audit.md)")
    return {"violation": violation, "leak_detected": bool(signals), "leak_signals": signals,
            "significant_auc_attacks": significant, "verdict": verdict}


# -- the whole audit ----------------------------------------------------------------------------


def _fewshot_settings(n_demos: int, positions: Sequence[int], insertion: Any) -> dict[str, Any]:
    """What ``audit.json`` says about a few-shot release: positions and canary ids only, no text."""
    shown = dict(zip(insertion.positions, insertion.canary_ids))
    return {"n_demos": n_demos, "demo_positions": list(positions),
            "member_canaries_shown": [shown[p] for p in positions if p in shown], "note": FEWSHOT_NOTE}


def canary_fingerprint(canary_set: CanarySet) -> str:
    """SHA-256 of the canary file's JSON: identifies the canaries without storing their secrets."""
    payload = json.dumps(canary_set.to_dict(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def _fewshot_run(task: ClassificationTask, private: Sequence[Example], engine: "Engine",
                 config: "DPESConfig", *, n_demos: int, seed: int, runs_root: str | Path,
                 run_dir: str | Path | None, evaluate: bool, task_name: str, engine_name: str) -> Any:
    """The ``fewshot`` release written as a run directory (no optimisation; NOT private).

    ``n_demos`` of the audited ``private`` records (the auditor's list, members included),
    drawn at random by ``seed`` and kept in their order, are appended to the seed prompt with
    ``task.render_demo``. Returns a :class:`dp_textgrad.workflow.RunOutcome` (``optimizer=None``)
    and the drawn positions.
    """
    from dp_textgrad import runs
    from dp_textgrad.dp_es.controller import RunResult
    from dp_textgrad.workflow import Evaluation, RunOutcome

    started = time.perf_counter()
    positions = sorted(int(i) for i in np.random.default_rng([seed, 0xFE5]).choice(len(private), n_demos,
                                                                                    replace=False))
    parts = [task.seed_prompt.strip()] if task.seed_prompt.strip() else []
    prompt = "\n\n".join(parts + [task.render_demo(private[i]) for i in positions])
    directory = Path(run_dir) if run_dir is not None else runs.new_run_dir(runs_root)
    directory.mkdir(parents=True, exist_ok=True)
    resolved = config.resolved(len(private))
    fewshot = {"n_demos": n_demos, "seed": seed, "note": FEWSHOT_NOTE}
    runs.write_json(directory / "config.json", {"task": task_name, "engine": engine_name, "fewshot": fewshot,
                                               "config": {}, "seed_prompt": task.seed_prompt,
                                               "dataset_size": len(private)})
    (directory / "released_prompt.txt").write_text(prompt + "\n", encoding="utf-8")
    result = RunResult(prompt=prompt, candidate_id="fewshot", estimate=None, epsilon=math.inf,
                       delta=float(resolved.delta), epsilons={}, generations_run=0,
                       stopped_because="fewshot mode: no optimisation (seed prompt plus raw private records)",
                       unsafe=True)
    evaluation = None
    if evaluate and task.test:
        evaluation = Evaluation(task.accuracy(engine, task.seed_prompt), task.accuracy(engine, prompt), len(task.test))
    seconds = time.perf_counter() - started
    runs.write_released_json(directory, runs.RESULT_NAME, "result", {
        **result.as_dict(), "epsilon": None, "fewshot": fewshot,
        "evaluation": evaluation.__dict__ if evaluation else None, "seconds": seconds})
    runs.append_run_log(directory.parent, {"run_dir": directory.name, "task": task_name, "engine": engine_name,
                                           "fewshot": fewshot, "private": False, "epsilon": None, "unsafe": True,
                                           "seconds": seconds, "machine": runs.machine_summary()},
                        run_dir=directory, channel="audit_log")
    return RunOutcome(directory, result, evaluation, seconds, None), positions  # type: ignore[arg-type]


def run_canary_audit(
    task: ClassificationTask,
    engine: "Engine",
    config: "DPESConfig",
    *,
    records: Sequence[Example],
    n_canaries: int,
    seed: int = 0,
    mode: AuditMode = "dp",
    options: CanaryAuditOptions | None = None,
    runs_root: str | Path = "runs",
    run_dir: str | Path | None = None,
    evaluate: bool = False,
    task_name: str = "custom",
    engine_name: str | None = None,
    canary_path: str | Path | None = None,
    on_generation: "Callable[[GenerationReport], None] | None" = None,
    log: bool = True,
    n_demos: int = DEFAULT_FEWSHOT_DEMOS,
) -> CanaryAuditResult:
    """One L2 audit: canaries into ``records``, one optimisation run, attacks on the release.

    ``records``: the auditor's canary-free private records (the task's own private set
    is never read; the run uses ``records`` plus the member canaries). ``n_canaries``
    canaries are generated from ``seed`` (their inclusion bits too). ``mode="dp"`` runs
    ``config`` as is (its ``mode`` must be ``"public"``); ``mode="unsafe"`` sets
    ``config.mode = "unsafe"``: the positive control, NOT differentially private;
    ``config.unsafe_examples`` private records (canary or not, drawn at random; all
    of them when it is at least the private set's size) then reach the mutator.
    ``mode="fewshot"`` runs no optimisation: the release is the task's seed prompt plus
    ``n_demos`` records of the audited private set (members included, drawn at random by
    ``seed``, rendered with ``task.render_demo``), what a naive few-shot prompt builder
    ships: a positive control that checks the attacks end to end, NOT private (``config``
    only gives delta).
    Writes ``audit.json`` into the run directory, rebuilds the report with its audit
    section, and appends one ``"kind": "audit_l2"`` line to the run log of the run's
    parent directory (``log=False``: no line). ``canary_path``: where to save the
    canary file (it holds the secrets: keep it out of the run directory and away
    from anything released); by default it is not saved, since ``seed`` rebuilds it.
    """
    from dp_textgrad import runs, workflow
    from dp_textgrad.report import write_report

    options = options or CanaryAuditOptions()
    if mode not in AUDIT_MODES:
        raise ValueError(f"mode: use 'dp', 'unsafe' or 'fewshot', got {mode!r}")
    if mode == "dp" and config.mode != "public":
        raise ValueError("mode: a 'dp' audit needs config.mode='public' (the config asks for unsafe mode); "
                         "use mode='unsafe' for the positive control")
    if isinstance(n_canaries, bool) or not isinstance(n_canaries, int) or n_canaries < 1:
        raise ValueError(f"n_canaries: must be an integer >= 1, got {n_canaries!r}")
    if isinstance(n_demos, bool) or not isinstance(n_demos, int) or n_demos < 1:
        raise ValueError(f"n_demos: must be an integer >= 1, got {n_demos!r}")
    records = list(records)
    if mode == "fewshot" and n_demos > len(records):
        raise ValueError(f"n_demos: {n_demos} demonstrations need at least {n_demos} records, got {len(records)}")
    if len(records) < n_canaries:
        raise ValueError(f"records: {n_canaries} canaries need at least {n_canaries} canary-free records to be "
                         f"spread over, got {len(records)}")
    started = time.perf_counter()
    canary_set = canaries_for_task(task, n_canaries, seed=seed, secret_kind=options.secret_kind)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        insertion = insert_canaries(records, canary_set, include="mask",
                                    warn_share=options.warn_share, max_share=options.max_share)
    share_warnings = [str(w.message) for w in caught]
    for message in share_warnings:
        warnings.warn(message, stacklevel=2)
    if canary_path is not None:
        save_canaries(canary_path, canary_set)
    audited_task = with_private_records(task, insertion.records)
    run_config = config.model_copy(update={"mode": "unsafe"}) if mode == "unsafe" else config
    engine_name = engine_name or str(getattr(engine, "model_string", type(engine).__name__))

    demo_positions: list[int] = []
    if mode == "fewshot":
        outcome, demo_positions = _fewshot_run(task, insertion.records, engine, run_config, n_demos=n_demos, seed=seed,
                                               runs_root=runs_root, run_dir=run_dir, evaluate=evaluate,
                                               task_name=task_name, engine_name=engine_name)
    else:
        outcome = workflow.run(audited_task, engine, run_config, runs_root=runs_root, run_dir=run_dir,
                               evaluate=evaluate, on_generation=on_generation, task_name=task_name,
                               engine_name=engine_name)
    optimise_seconds = time.perf_counter() - started
    result = outcome.result
    reference = task.seed_prompt
    part = attack_release(engine, task, result.prompt, canary_set, delta=float(result.delta),
                          reference_prompt=reference, options=options, seed=seed)
    claim = _finite_or_none(result.epsilon) if not result.unsafe else None
    ledger = getattr(outcome.optimizer, "ledger", None)
    mechanism_epsilon = None
    if ledger is not None and hasattr(ledger, "mechanism_epsilon"):
        mechanism_epsilon = _finite_or_none(ledger.mechanism_epsilon())
    judged = _judge(mode, claim, part)
    seconds = time.perf_counter() - started
    members = int(canary_set.included_mask.sum())
    audit = {
        "format": AUDIT_FORMAT,
        "version": AUDIT_VERSION,
        "kind": AUDIT_KIND,
        "mode": mode,
        "run_dir": outcome.run_dir.name,
        "task": task_name,
        "engine": engine_name,
        "code_version": runs.code_version(),
        "statement": STATEMENT,
        "settings": {
            **options.to_dict(),
            "n_canaries": n_canaries,
            "seed": seed,
            "n_records": len(records),
            "config": run_config.model_dump(),
            "evaluate": evaluate,
            "reference_prompt": "the task's seed prompt",
            **({"fewshot": _fewshot_settings(n_demos, demo_positions, insertion)} if mode == "fewshot" else {}),
        },
        "canaries": {
            "n": n_canaries,
            "n_members": members,
            "n_nonmembers": n_canaries - members,
            "share": insertion.share,
            "seed": canary_set.seed,
            "mask_seed": canary_set.mask_seed,
            "secret_kind": canary_set.secret_kind,
            "fingerprint_sha256": canary_fingerprint(canary_set),
            "saved_to": str(canary_path) if canary_path is not None else None,
            "share_warnings": share_warnings,
        },
        "claim": {
            "epsilon": claim,
            "delta": float(result.delta),
            "unsafe": bool(result.unsafe),
            "mechanism_epsilon": mechanism_epsilon,
            "epsilon_by_accountant": {k: _finite_or_none(v) for k, v in result.epsilons.items()},
            "source": "none (fewshot mode runs no mechanism)" if mode == "fewshot"
                      else "the run's privacy ledger (result.json)",
            "note": FEWSHOT_NOTE if mode == "fewshot" else
                    "unsafe mode: raw private records reached the mutator; no guarantee is claimed"
                    if result.unsafe else "",
        },
        **part,
        **judged,
    }
    # Wall times include the private scoring phase: operator-only, kept apart from audit.json.
    runs.write_operator_json(outcome.run_dir, "audit_seconds.json",
                             {"optimise": optimise_seconds, "attack": seconds - optimise_seconds, "total": seconds})
    runs.write_json(outcome.run_dir / AUDIT_FILE_NAME, audit)
    write_report(outcome.run_dir)
    if log:
        runs.append_run_log(outcome.run_dir.parent, {
            "kind": AUDIT_KIND,
            "command": "audit canaries",
            "run_dir": outcome.run_dir.name,
            "mode": mode,
            **({"private": False, "note": FEWSHOT_NOTE} if mode == "fewshot" else {}),
            "task": task_name,
            "engine": engine_name,
            "settings": audit["settings"],
            "canaries": {k: v for k, v in audit["canaries"].items() if k != "share_warnings"},
            "claim": audit["claim"],
            "eps_lb": audit["eps_lb"],
            "gdp_estimate": audit["gdp_estimate"],
            "auc": {name: a["auc"]["estimate"] for name, a in audit["attacks"].items() if "auc" in a},
            "verbatim_members": audit["leakage"]["prompt_text"]["verbatim_members"],
            "extracted_members": audit["leakage"]["extraction"]["extracted_members"],
            "violation": audit["violation"],
            "leak_detected": audit["leak_detected"],
            "verdict": audit["verdict"],
            "seconds": seconds,
            "machine": runs.machine_summary(),
        }, run_dir=outcome.run_dir, channel="audit_log")
    return CanaryAuditResult(outcome.run_dir, audit, seconds)


def read_audit(run_dir: str | Path) -> dict[str, Any] | None:
    """The ``audit.json`` of a run directory, or ``None`` when it has none (the report reads it too)."""
    from dp_textgrad.report import read_audit as _read

    return _read(Path(run_dir))


__all__ = [
    "AUDIT_FILE_NAME", "AUDIT_MODES", "AuditMode", "CanaryAuditOptions", "CanaryAuditResult", "DEFAULT_FEWSHOT_DEMOS",
    "LEAKAGE_ATTACKS", "STATEMENT",
    "attack_release", "canary_fingerprint", "read_audit", "run_canary_audit",
]
