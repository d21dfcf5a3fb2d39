"""The report's charts, as PNG bytes.

Every value plotted is DP-released (noisy estimates with their noise std, epsilon spent,
the public lineage) or the user's test-split evaluation, which the chart labels as outside
the guarantee. Axes are integers where they count generations.
"""

from __future__ import annotations

import io
import math
from types import ModuleType
from typing import TYPE_CHECKING, Any

from scipy.stats import binomtest

from dp_textgrad.dp_es.estimates import Z95

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

BLUE, GREY, ORANGE = "#2b6cb0", "#8a8f98", "#dd6b20"


def _pyplot() -> ModuleType:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update(
        {
            "font.size": 9,
            "axes.spines.top": False,
            "axes.spines.right": False,
            "axes.titlesize": 10,
            "axes.titleweight": "bold",
        }
    )
    return plt


def _png(fig: Figure) -> bytes:
    plt = _pyplot()
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png", dpi=120, bbox_inches="tight")  # long titles stay whole
    plt.close(fig)
    return buffer.getvalue()


def _integer_generations(ax: Axes, generations: list[int]) -> None:
    if generations:
        low, high = min(generations), max(generations)
        step = max(1, (high - low) // 10)  # at most about ten labels
        ax.set_xticks(range(low, high + 1, step))
        ax.set_xlim(low - 0.4, high + 0.4)
    ax.set_xlabel("generation")


def scores_chart(metrics: list[dict[str, Any]]) -> bytes:
    """Best and mean DP estimates per generation, the best with its 95% noise band."""
    plt = _pyplot()
    gens = [int(m["generation"]) for m in metrics]
    best = [float(m["best_estimate"]) for m in metrics]
    mean = [float(m["mean_estimate"]) for m in metrics]
    half = [Z95 * float(m.get("noise_std_estimate") or 0.0) for m in metrics]
    fig, ax = plt.subplots(figsize=(6.0, 3.2))
    ax.fill_between(
        gens,
        [b - h for b, h in zip(best, half)],
        [b + h for b, h in zip(best, half)],
        color=BLUE,
        alpha=0.15,
        linewidth=0,
        label="95% noise interval of the best",
    )
    ax.plot(gens, best, marker="o", color=BLUE, label="best candidate (DP estimate)")
    ax.plot(gens, mean, marker="s", markersize=4, linestyle="--", color=GREY, label="population mean (DP)")
    _integer_generations(ax, gens)
    ax.set_ylabel("score estimate")
    ax.set_title("Scores per generation (noisy, DP-released)")
    ax.legend(fontsize=7, loc="best", frameon=False)
    return _png(fig)


def privacy_chart(metrics: list[dict[str, Any]], budget: float | None) -> bytes:
    """Epsilon spent after each generation under the bound the ledger uses, against the budget.

    Looser accountants (DRV can be 100x larger) would flatten this line on a shared axis:
    the report lists them in a table instead.
    """
    plt = _pyplot()
    gens = [int(m["generation"]) for m in metrics]
    spent = [float(m["epsilon_spent"]) for m in metrics]
    used = _used_accountant(metrics[-1]) if metrics else None
    fig, ax = plt.subplots(figsize=(6.0, 3.0))
    ax.plot(gens, spent, marker="o", color=BLUE, linewidth=2, label=f"spent ({used or 'smallest bound'})")
    runner_up = _runner_up(metrics)
    if runner_up is not None:
        name, values = runner_up
        ax.plot(gens, values, marker=".", color=GREY, linestyle=":", label=f"next tightest ({name})")
    if budget is not None and math.isfinite(budget):
        ax.axhline(budget, color=ORANGE, linestyle="--", linewidth=1, label=f"budget {budget:g}")
    ax.set_ylim(bottom=0)
    _integer_generations(ax, gens)
    ax.set_ylabel("epsilon (cumulative)")
    ax.set_title("Privacy spent")
    ax.legend(fontsize=7, loc="lower right", frameon=False)
    return _png(fig)


def _used_accountant(row: dict[str, Any]) -> str | None:
    epsilons = {k: v for k, v in row.get("epsilons", {}).items() if v is not None and math.isfinite(v)}
    return min(epsilons, key=epsilons.__getitem__) if epsilons else None


def _runner_up(metrics: list[dict[str, Any]]) -> tuple[str, list[float]] | None:
    final = (
        {k: v for k, v in metrics[-1].get("epsilons", {}).items() if v is not None and math.isfinite(v)}
        if metrics
        else {}
    )
    if len(final) < 2:
        return None
    ranked = sorted(final, key=final.__getitem__)
    name = ranked[1]
    if final[name] > 3 * final[ranked[0]]:
        return None  # off the scale that matters: the table shows it
    return name, [float(m["epsilons"].get(name, math.nan)) for m in metrics]


def accuracy_ci(accuracy: float, n: int) -> tuple[float, float]:
    """Wilson 95% interval of a test accuracy over n records."""
    successes = round(accuracy * n)
    ci = binomtest(successes, n).proportion_ci(confidence_level=0.95, method="wilson")
    return float(ci.low), float(ci.high)


def evaluation_intervals(evaluation: dict[str, Any]) -> list[tuple[float, float]]:
    """The seed's and the released prompt's 95% intervals of a result's evaluation block: as
    written (a bootstrap for a non-binary metric), or Wilson for a run written before they were."""
    n = int(evaluation["n_test"])
    out = []
    for key in ("seed", "released"):
        low, high = evaluation.get(f"{key}_low"), evaluation.get(f"{key}_high")
        if low is None or high is None:
            low, high = accuracy_ci(float(evaluation[f"{key}_accuracy"]), n)
        out.append((float(low), float(high)))
    return out


def evaluation_chart(evaluation: dict[str, Any]) -> bytes:
    """Seed vs released test score (the task's metric) with 95% intervals and the paired difference."""
    from dp_textgrad.report.fmt import INTERVAL_LABELS, metric_label

    plt = _pyplot()
    n = int(evaluation["n_test"])
    names = ["seed prompt", "released prompt"]
    values = [float(evaluation["seed_accuracy"]), float(evaluation["released_accuracy"])]
    cis = evaluation_intervals(evaluation)
    fig, ax = plt.subplots(figsize=(6.0, 2.4))
    ax.barh(names, values, color=[GREY, BLUE], height=0.5)
    ax.errorbar(
        values,
        names,
        xerr=[[v - lo for v, (lo, _) in zip(values, cis)], [hi - v for v, (_, hi) in zip(values, cis)]],
        fmt="none",
        ecolor="black",
        capsize=4,
        linewidth=1,
    )
    for y, value in enumerate(values):
        ax.text(0.01, y, f"{value:.3f}", va="center", color="white", fontsize=8, fontweight="bold")
    ax.set_xlim(0, 1)
    method = INTERVAL_LABELS.get(str(evaluation.get("interval") or "wilson"), "Wilson")
    ax.set_xlabel(f"test {metric_label(evaluation.get('metric'))} (n = {n}; 95% {method} intervals)")
    title = "Test split (outside the DP guarantee)"
    if evaluation.get("difference") is not None:
        title += (
            f"\npaired difference {evaluation['difference']:+.3f} "
            f"[{evaluation['difference_low']:+.3f}, {evaluation['difference_high']:+.3f}]"
        )
        if evaluation.get("mcnemar_p") is not None:
            title += f", McNemar p = {evaluation['mcnemar_p']:.2g}"
    ax.set_title(title, fontsize=10)
    return _png(fig)


def lineage_chart(lineage: list[dict[str, Any]]) -> bytes:
    """The released prompt's ancestry: one column per generation, an arrow from each parent."""
    plt = _pyplot()
    by_generation: dict[int, list[dict[str, Any]]] = {}
    for cand in sorted(lineage, key=lambda c: (int(c.get("generation", 0)), str(c.get("id")))):
        by_generation.setdefault(int(cand.get("generation", 0)), []).append(cand)
    position: dict[str, tuple[float, float]] = {}
    for generation, column in by_generation.items():
        for row, cand in enumerate(column):
            position[str(cand["id"])] = (generation, row - (len(column) - 1) / 2)
    height = max(len(column) for column in by_generation.values())
    fig, ax = plt.subplots(figsize=(6.0, 1.4 + 0.7 * height))
    for cand in lineage:
        child = position[str(cand["id"])]
        for parent_id in cand.get("parent_ids", []):
            if parent_id in position:
                ax.annotate(
                    "",
                    xy=child,
                    xytext=position[parent_id],
                    arrowprops=dict(arrowstyle="-|>", color=GREY, lw=1, shrinkA=7, shrinkB=7),
                )
    released = str(lineage[0]["id"])
    for cand in lineage:
        x, y = position[str(cand["id"])]
        ax.scatter([x], [y], s=70, color=ORANGE if str(cand["id"]) == released else BLUE, zorder=3)
        ax.annotate(
            f"{cand.get('operator')}\n{cand.get('id')}",
            (x, y),
            textcoords="offset points",
            xytext=(0, 9),
            ha="center",
            fontsize=7,
        )
    gens = list(by_generation)
    _integer_generations(ax, gens)
    ax.set_ylim(-height / 2 - 0.3, height / 2 + 0.6)
    ax.set_yticks([])
    ax.spines["left"].set_visible(False)
    ax.set_title("Lineage of the released prompt (orange), operator and id per candidate")
    return _png(fig)


def audit_roc_chart(audit: dict[str, Any], ordered: list[tuple[str, Any]]) -> bytes:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.0, 4.2))
    ax.plot([0, 1], [0, 1], color=GREY, linestyle=":", linewidth=1, label="chance")
    for name, attack in ordered:
        roc = attack["roc"]
        ax.plot(roc["fpr"], roc["tpr"], linewidth=1.2, label=f"{name} (AUC {attack['auc']['estimate']:.2f})")
    canaries = audit.get("canaries", {})
    ax.set_xlabel(f"false positive rate ({canaries.get('n_nonmembers', '?')} non-member canaries)")
    ax.set_ylabel(f"true positive rate ({canaries.get('n_members', '?')} member canaries)")
    ax.set_title("Membership attacks on the released prompt (ROC)")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=7, loc="lower right", frameon=False)
    return _png(fig)
