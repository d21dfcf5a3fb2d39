"""Run reports (Markdown and HTML with plots), rebuilt from a run directory alone.

Everything plotted is already DP-released (noisy estimates, epsilon spent) or is the
user's own test-split evaluation, which the report labels as outside the guarantee.
"""

from __future__ import annotations

import base64
import html
import io
import math
from pathlib import Path
from typing import Any

from dp_textgrad import _io, runs

UNSAFE_BANNER = "**WARNING: this run was in unsafe mode. It is NOT differentially private.**"
FEWSHOT_BANNER = ("**WARNING: few-shot positive control: no optimisation; the released prompt is the seed prompt "
                  "plus raw private records. It is NOT differentially private.**")


AUDIT_FILE_NAME = runs.AUDIT_NAME  # written by dp_textgrad.audit.end_to_end
AUDIT_FORMAT = "dp-textgrad-audit"


def read_audit(directory: Path) -> dict[str, Any] | None:
    """The run's ``audit.json`` (an L2 canary audit), or ``None`` when there is none."""
    path = Path(directory) / AUDIT_FILE_NAME
    if not path.exists():
        return None
    audit = runs.read_json(path)
    if not isinstance(audit, dict) or audit.get("format") != AUDIT_FORMAT:
        raise ValueError(f"audit.json: {path} is not a dp-textgrad audit file (format {AUDIT_FORMAT!r})")
    return audit


def _plots(result: dict[str, Any], metrics: list[dict[str, Any]],
           audit: dict[str, Any] | None = None) -> dict[str, bytes]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    images: dict[str, bytes] = {}
    gens = [m["generation"] for m in metrics]

    def save(fig, name: str) -> None:
        buffer = io.BytesIO()
        fig.tight_layout()
        fig.savefig(buffer, format="png", dpi=110)
        plt.close(fig)
        images[name] = buffer.getvalue()

    if metrics:
        fig, ax = plt.subplots(figsize=(5.5, 3.2))
        ax.plot(gens, [m["best_estimate"] for m in metrics], marker="o", label="best (shrunk noisy estimate)")
        ax.plot(gens, [m["mean_estimate"] for m in metrics], marker=".", linestyle="--", label="population mean")
        ax.set_xlabel("generation")
        ax.set_ylabel("DP score estimate")
        ax.set_title("Score per generation (noisy, DP-released)")
        ax.legend(fontsize=8)
        save(fig, "scores.png")

        fig, ax = plt.subplots(figsize=(5.5, 3.2))
        names = sorted({k for m in metrics for k in m.get("epsilons", {})})
        for name in names:
            values = [m["epsilons"].get(name, math.nan) for m in metrics]
            ax.plot(gens, [v if math.isfinite(v) else math.nan for v in values], marker=".", label=name)
        ax.plot(gens, [m["epsilon_spent"] for m in metrics], color="black", linewidth=2, label="used (smallest)")
        ax.set_xlabel("generation")
        ax.set_ylabel("epsilon spent")
        ax.set_yscale("log")
        ax.set_title("Privacy spent by accountant")
        ax.legend(fontsize=7)
        save(fig, "epsilon.png")

    evaluation = result.get("evaluation")
    if evaluation:
        fig, ax = plt.subplots(figsize=(4.0, 3.0))
        ax.bar(["seed prompt", "released prompt"],
               [evaluation["seed_accuracy"], evaluation["released_accuracy"]], color=["#999999", "#2b6cb0"])
        ax.set_ylim(0, 1)
        ax.set_ylabel(f"test accuracy (n={evaluation['n_test']})")
        ax.set_title("Seed vs released (not covered by DP)")
        save(fig, "accuracy.png")

    lineage = result.get("lineage") or []
    if lineage:
        fig, ax = plt.subplots(figsize=(5.5, 0.6 + 0.45 * len(lineage)))
        for row, cand in enumerate(lineage):
            ax.scatter(cand.get("generation", 0), row, color="#2b6cb0")
            ax.annotate(f"{cand.get('id')} ({cand.get('operator')})", (cand.get("generation", 0), row),
                        textcoords="offset points", xytext=(6, -3), fontsize=8)
        ax.set_yticks([])
        ax.set_xlabel("generation")
        ax.set_title("Lineage of the released prompt (oldest at the bottom)")
        ax.margins(x=0.6, y=0.3)
        save(fig, "lineage.png")

    curves = {name: a for name, a in (audit or {}).get("attacks", {}).items() if a.get("roc")}
    if curves:
        fig, ax = plt.subplots(figsize=(5.0, 4.2))
        ax.plot([0, 1], [0, 1], color="#999999", linestyle=":", linewidth=1, label="chance")
        for name, attack in _ordered_attacks(curves):
            roc = attack["roc"]
            ax.plot(roc["fpr"], roc["tpr"], linewidth=1.2,
                    label=f"{name} (AUC {attack['auc']['estimate']:.2f})")
        canaries = audit.get("canaries", {}) if audit else {}
        ax.set_xlabel(f"false positive rate ({canaries.get('n_nonmembers', '?')} non-member canaries)")
        ax.set_ylabel(f"true positive rate ({canaries.get('n_members', '?')} member canaries)")
        ax.set_title("Membership attacks on the released prompt (ROC)")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1.02)
        ax.legend(fontsize=7, loc="lower right")
        save(fig, "audit_roc.png")
    return images


def _num(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    value = float(value)
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return f"{value:.{digits}f}"


def _interval(interval: dict[str, Any] | None) -> str:
    if not interval:
        return "-"
    return f"{_num(interval['estimate'])} [{_num(interval['low'])}, {_num(interval['high'])}]"


# Table order: leakage measures, then the membership attacks (others after, alphabetically).
_ATTACK_ORDER = ("prompt_text", "extraction", "exposure", "loss", "zlib", "min_k", "min_k_pp", "reference",
                 "recall", "grad_norm")


def _ordered_attacks(attacks: dict[str, Any]) -> list[tuple[str, Any]]:
    rank = {name: i for i, name in enumerate(_ATTACK_ORDER)}
    return sorted(attacks.items(), key=lambda item: (rank.get(item[0], len(rank)), item[0]))


def audit_markdown(audit: dict[str, Any], roc_image: str | None = None) -> list[str]:
    """The report's audit section (Markdown lines) from an ``audit.json`` payload."""
    claim, bound, canaries = audit["claim"], audit["eps_lb"], audit["canaries"]
    leakage = audit["leakage"]
    gdp = audit.get("gdp_estimate")
    mode = audit.get("mode")
    level = 1 - float(bound["alpha"])
    claimed = _num(claim["epsilon"]) if claim["epsilon"] is not None else \
        ("none (fewshot: NOT private)" if mode == "fewshot" else "none (unsafe mode)")
    estimate = f"{_num(gdp['epsilon'])} ({gdp['attack']}, pre-registered)" if gdp else "-"
    attack = f" ({bound['attack']})" if bound.get("attack") else ""
    lines = [
        "## Privacy audit (L2: canaries through the whole run)",
        "",
        f"**{audit['verdict']}**",
        "",
        f"- mode: {mode}" + {"unsafe": " (positive control: raw private records reach the mutator; it must leak)",
                              "fewshot": " (positive control, NOT private: no optimisation, the release is the "
                                         "seed prompt plus raw private records; it must leak)"}.get(
                                             mode, " (the library's DP-ES)"),
        f"- canaries: {canaries['n']} ({canaries['n_members']} members inserted by their Bernoulli(1/2) bit, "
        f"{canaries['n_nonmembers']} non-members), {canaries['share']:.1%} of the private set; "
        f"canary seed {canaries['seed']}, fingerprint `{canaries['fingerprint_sha256'][:16]}`",
        f"- one-run guesses: k_pos = {bound['k_pos']}, k_neg = {bound['k_neg']} (fixed before the run); "
        f"{bound['n_attacks']} attacks, each bound at alpha = {bound['alpha_per_attack']:.4g}"
        + (f"; a perfect attack would show eps_lb = {_num(bound['ceiling'])} at most with these settings"
           if bound.get("ceiling") is not None else ""),
        "",
        "| claimed epsilon (ledger) | eps_lb (one-run, lower bound) | Gaussian-DP (estimate, not a bound) | delta |",
        "|---|---|---|---|",
        f"| {claimed} | {_num(bound['epsilon'])} at {level:.0%} confidence{attack} | {estimate} | "
        f"{claim['delta']:.3g} |",
        "",
        f"- secrets verbatim in the released prompt: {leakage['prompt_text']['verbatim_members']} member(s), "
        f"{leakage['prompt_text']['verbatim_nonmembers']} non-member(s); longest common substring up to "
        f"{leakage['prompt_text']['max_lcs_fraction']:.0%} of a secret",
        f"- greedy extraction: {leakage['extraction']['extracted_members']} member(s), "
        f"{leakage['extraction']['extracted_nonmembers']} non-member(s); mean matched share "
        f"{leakage['extraction']['mean_matched_fraction']:.0%}",
        f"- exposure (of at most {leakage['exposure']['max_possible']:.2f} bits, "
        f"{leakage['exposure']['n_references']} references): members {_num(leakage['exposure']['mean_members'], 2)}, "
        f"non-members {_num(leakage['exposure']['mean_nonmembers'], 2)}",
    ]
    for rate in leakage.get("top_k", []):
        value = rate["token_rate"] if rate["token_rate"] is not None else rate["token_rate_lower_bound"]
        qualifier = "" if rate["token_rate"] is not None else " (lower bound: the engine lists fewer alternatives)"
        lines.append(f"- top-{rate['k']} token hit rate of the secrets: {value:.0%}{qualifier}")
    fpr_targets = []
    for attack in audit["attacks"].values():
        if attack.get("tpr_at_fpr"):
            fpr_targets = [t["target_fpr"] for t in attack["tpr_at_fpr"]]
            break
    header = ["attack", "ROC-AUC [95% CI]", "PR-AUC [95% CI]"] + [f"TPR at {f:g} FPR" for f in fpr_targets] + \
        ["Cohen's d [95% CI]", "Hedges' g", "one-run eps_lb", "GDP eps (estimate)"]
    lines += ["", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, attack in _ordered_attacks(audit["attacks"]):
        if not attack.get("available"):
            lines.append(f"| {name} | unavailable: {attack.get('note', '')} |" + " |" * (len(header) - 2))
            continue
        if "auc" not in attack:
            cells = [name, "-", "-"] + ["-"] * len(fpr_targets) + ["-", "-", _num(attack["one_run"]["epsilon"]), "-"]
        else:
            tprs = [_num(t["tpr"], 2) if t["tpr"] is not None else "n/a" for t in attack["tpr_at_fpr"]]
            cells = [name, _interval(attack["auc"]), _interval(attack["pr_auc"])] + tprs + [
                f"{_interval(attack['cohens_d'])} ({attack['magnitude']})", _num(attack["hedges_g"]),
                _num(attack["one_run"]["epsilon"]), _num(attack["gdp_estimate"]["epsilon"])]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "TPR at an FPR needs at least 1/FPR non-members (n/a otherwise).", ""]
    if roc_image is not None:
        lines += [f"![audit_roc.png]({roc_image})", ""]
    for note in audit.get("notes", []):
        lines.append(f"- note: {note}")
    lines += ["", "What this does and does not prove: " + audit.get("statement", ""), ""]
    return lines


def build_markdown(run_dir: Path, config: dict[str, Any], result: dict[str, Any],
                   metrics: list[dict[str, Any]], images: dict[str, str],
                   audit: dict[str, Any] | None = None) -> str:
    lines: list[str] = []
    fewshot = config.get("fewshot")
    if fewshot:
        lines += [FEWSHOT_BANNER, ""]
    elif result.get("unsafe"):
        off = config.get("config", {}).get("privacy") == "off"
        lines += [UNSAFE_BANNER.replace("was in unsafe mode", "had privacy off (a baseline)") if off
                  else UNSAFE_BANNER, ""]
    lines += [f"# dp-textgrad run `{run_dir.name}`", ""]
    cfg = config.get("config", {})
    guarantee = [
        "## Guarantee",
        "",
        f"- epsilon spent: **{result['epsilon']:.4g}** (budget {cfg.get('epsilon')}), delta = {result['delta']:.3g}"
        if not result.get("unsafe") else "- epsilon: not differentially private (unsafe mode)",
        "- unit of privacy: one record; neighbouring datasets differ by adding or removing one record",
        f"- selection: {cfg.get('selection')}; noise multiplier z = {config.get('noise_multiplier')}; "
        f"per-selection epsilon0 = {config.get('selection_epsilon')}",
        f"- schedule: {cfg.get('generations')} generations, population {cfg.get('population')}, "
        f"parents {cfg.get('parents')}, sampling rate q = {cfg.get('sampling_rate')}",
        f"- noise: {result.get('noise') or config.get('noise') or ('INSECURE reproducible seed (research only)' if cfg.get('insecure_noise_seed') is not None else 'OS entropy')}",
        "",
        "| accountant | epsilon |",
        "|---|---|",
    ]
    if fewshot:
        guarantee = ["## Guarantee", "", "- none: NOT differentially private (few-shot positive control)",
                     f"- no optimisation: the seed prompt plus {fewshot.get('n_demos')} raw private records drawn "
                     f"at random (seed {fewshot.get('seed')}), what a naive few-shot prompt builder ships"]
    lines += guarantee
    for name, value in sorted(result.get("epsilons", {}).items()):
        lines.append(f"| {name} | {value:.4g} |")
    lines += ["", "## Released prompt", "", "```text", result["prompt"], "```", ""]
    if result.get("estimate") is not None:
        lines += [f"DP estimate of its score: {result['estimate']:.3f} (noisy, shrunk).", ""]
    evaluation = result.get("evaluation")
    if evaluation:
        lines += [
            "## Test-split evaluation (research only, not covered by the guarantee)",
            "",
            f"| prompt | accuracy (n={evaluation['n_test']}) |",
            "|---|---|",
            f"| seed | {evaluation['seed_accuracy']:.3f} |",
            f"| released | {evaluation['released_accuracy']:.3f} |",
            "",
        ]
        if evaluation.get("difference") is not None:
            better, worse = evaluation.get("discordant") or (0, 0)
            lines += [f"Paired on the same {evaluation['n_test']} records: difference "
                      f"{evaluation['difference']:+.3f} (95% CI {evaluation['difference_low']:+.3f} to "
                      f"{evaluation['difference_high']:+.3f}); exact McNemar test p = {evaluation['mcnemar_p']:.2g} "
                      f"({better} records only the released prompt gets right, {worse} only the seed).", ""]
    if metrics:
        lines += ["## Generations (noisy statistics and public costs only)", "",
                  "| gen | best estimate | mean estimate | epsilon spent | public calls | public tokens |",
                  "|---|---|---|---|---|---|"]
        for m in metrics:
            lines.append(
                f"| {m['generation']} | {m['best_estimate']:.3f} | {m['mean_estimate']:.3f} | "
                f"{m['epsilon_spent']:.4g} | {m.get('public_calls', '-')} | "
                f"{m.get('public_prompt_tokens', 0) + m.get('public_completion_tokens', 0)} |"
            )
        lines += ["", "Public costs are the mutation, critique and preflight calls, which see public text and DP "
                  "outputs only. The private scoring phase's real usage and time are derived from the secret "
                  "subsample and are not shown (they stay in the run's operator/ folder).", ""]
    for name, ref in images.items():
        if not name.startswith("audit_"):
            lines += [f"![{name}]({ref})", ""]
    lines += [f"Stopped because: {result.get('stopped_because')}.", ""]
    if audit is not None:
        lines += audit_markdown(audit, images.get("audit_roc.png"))
    return "\n".join(lines)


def _markdown_to_html(markdown: str, images: dict[str, bytes]) -> str:
    """A small renderer for the subset of Markdown the report uses (no extra dependency)."""
    out: list[str] = []
    in_code = False
    in_table = False
    for raw in markdown.splitlines():
        if raw.startswith("```"):
            out.append("</pre>" if in_code else "<pre>")
            in_code = not in_code
            continue
        if in_code:
            out.append(html.escape(raw))
            continue
        if raw.startswith("|"):
            cells = [c.strip() for c in raw.strip("|").split("|")]
            if all(set(c) <= {"-"} for c in cells):
                continue
            if not in_table:
                out.append("<table>")
                in_table = True
            out.append("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in cells) + "</tr>")
            continue
        if in_table:
            out.append("</table>")
            in_table = False
        if raw.startswith("!["):
            name = raw[2:raw.index("]")]
            data = base64.b64encode(images[name]).decode("ascii")
            out.append(f'<p><img alt="{html.escape(name)}" src="data:image/png;base64,{data}"></p>')
        elif raw.startswith("# "):
            out.append(f"<h1>{_inline(raw[2:])}</h1>")
        elif raw.startswith("## "):
            out.append(f"<h2>{_inline(raw[3:])}</h2>")
        elif raw.startswith("- "):
            out.append(f"<li>{_inline(raw[2:])}</li>")
        elif raw.strip():
            out.append(f"<p>{_inline(raw)}</p>")
    if in_table:
        out.append("</table>")
    style = ("body{font-family:sans-serif;max-width:860px;margin:2em auto;line-height:1.4}"
             "pre{background:#f4f4f4;padding:1em;white-space:pre-wrap}td{border:1px solid #ccc;padding:2px 8px}"
             "table{border-collapse:collapse}")
    return f"<!doctype html><html><head><meta charset='utf-8'><title>dp-textgrad report</title>" \
           f"<style>{style}</style></head><body>{''.join(out)}</body></html>\n"


def _inline(text: str) -> str:
    escaped = html.escape(text)
    parts = escaped.split("**")
    escaped = "".join(f"<b>{p}</b>" if i % 2 else p for i, p in enumerate(parts))
    parts = escaped.split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


def write_report(run_dir: str | Path) -> Path:
    """(Re)build ``report.md``, ``report.html`` and ``plots/`` from the files of a run directory."""
    layout = runs.RunDir(run_dir)
    directory = layout.path
    if not layout.result.exists():
        raise FileNotFoundError(f"run_dir: no {layout.result.name} in {directory}; the run has not finished "
                                "(resume it first)")
    config = runs.read_json(layout.config) if layout.config.exists() else {}
    result = runs.read_json(layout.result)
    metrics = list(_io.read_jsonl(layout.metrics))
    audit = read_audit(directory)
    images = _plots(result, metrics, audit)
    plot_dir = directory / runs.PLOTS_DIR
    plot_dir.mkdir(exist_ok=True)
    for name, data in images.items():
        (plot_dir / name).write_bytes(data)
    markdown = build_markdown(directory, config, result, metrics, {n: f"{runs.PLOTS_DIR}/{n}" for n in images}, audit)
    _io.atomic_write_text(directory / runs.REPORT_NAME, markdown)
    html_markdown = build_markdown(directory, config, result, metrics, {n: n for n in images}, audit)
    _io.atomic_write_text(directory / "report.html", _markdown_to_html(html_markdown, images))
    return directory / runs.REPORT_NAME
